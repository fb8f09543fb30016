"""The hostile corpus, built once per session beside a planted secret, and what every outcome must respect."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.corpus import REFUSED, VERIFIED, Case, build

#: Words that would mean an internal exception reached the user instead of a sentence about the model.
INTERNAL = re.compile(r"Traceback|\b(Value|Key|Type|Attribute|Index|UnicodeDecode|Validation|Assertion|Runtime"
                      r"|Recursion|Overflow|ZeroDivision)Error\b|pass '[^']+' failed")
#: Characters a terminal would act on.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: Cases whose outcome comes from running the model (verification children): the slow part of the corpus.
SLOW = {"bomb_loop_condition_never_false", "bomb_constantofshape_negative", "bomb_range_float_infinite",
        "name_duplicate_nodes", "bomb_input_dims_huge"}


@dataclass(frozen=True)
class Corpus:
    root: Path
    models: Path
    secret: bytes
    cases: list[Case]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Corpus:
    root = tmp_path_factory.mktemp("hostile")
    secret = b"MIRSERVE-PLANTED-SECRET-" + os.urandom(12).hex().encode()
    planted = root / "planted" / "secret.bin"
    planted.parent.mkdir()
    planted.write_bytes(secret)
    cases = build(root / "models", planted)
    return Corpus(root, root / "models", secret, cases)


def case_params() -> list:
    """Every case as a pytest parameter; the ones that need verification children are marked ``models``."""
    from tests.hostile.corpus import all_cases

    found = []
    for name, (case, _) in all_cases(Path("/nonexistent/secret.bin")).items():
        marks = [pytest.mark.models] if case.expect == VERIFIED or name in SLOW else []
        found.append(pytest.param(case, id=name, marks=marks))
    return found


def assert_clean_refusal(case: Case, message: str) -> None:
    """A refusal is one sentence about the model: what and where, no internal exception, nothing a terminal
    would act on."""
    assert case.expect == REFUSED, f"{case.name} should have been optimized and verified, but: {message}"
    assert message and not INTERNAL.search(message), message
    assert not CONTROL.search(message), message
    assert case.says in message, f"{case.name}: {message!r} does not say {case.says!r}"
