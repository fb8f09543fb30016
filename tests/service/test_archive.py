"""Archive uploads, member by member: every hostile form is refused naming the member, nothing is written
outside the extraction directory, and a model with its external data unpacks whole."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.archives import HOSTILE_CASES, hostile, model_with_external_data, pack, pack_directory
from worker.jobs.archive import ArchiveError, ArchiveLimits, archive_kind, check_upload, extract, file_kind

LIMITS = ArchiveLimits()


def files_under(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    return model_with_external_data(tmp_path_factory.mktemp("model")).read_bytes()


@pytest.fixture(scope="module")
def hostile_archives(model_bytes) -> dict[str, tuple[bytes, str]]:
    archives = hostile(model_bytes)
    assert set(archives) == set(HOSTILE_CASES)
    return archives


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_a_hostile_archive_is_refused_naming_the_member_and_writes_nothing(tmp_path, hostile_archives, case):
    data, member = hostile_archives[case]
    upload = tmp_path / "job" / "input.onnx"
    upload.parent.mkdir()
    upload.write_bytes(data)
    before = files_under(tmp_path)
    with pytest.raises(ArchiveError) as listed:
        check_upload(upload, LIMITS)
    assert listed.value.member == member and repr(member) in str(listed.value)
    with pytest.raises(ArchiveError) as unpacked:
        extract(upload, file_kind(upload), tmp_path / "job" / "input", LIMITS)
    assert unpacked.value.member == member
    assert files_under(tmp_path) - before <= {"job/input"}, "something was written before the refusal"


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz"])
def test_a_model_and_its_external_data_unpack_whole(tmp_path, kind):
    source = model_with_external_data(tmp_path / "source").parent
    upload = tmp_path / "input.onnx"
    upload.write_bytes(pack_directory(kind, source))
    assert check_upload(upload, LIMITS) == kind
    model = extract(upload, kind, tmp_path / "unpacked", LIMITS)
    assert model == tmp_path / "unpacked" / "model.onnx"
    assert {p.name: p.read_bytes() for p in model.parent.iterdir()} == \
           {p.name: p.read_bytes() for p in source.iterdir()}


def test_members_in_a_directory_unpack_there_and_the_model_is_found_in_it(tmp_path, model_bytes):
    upload = tmp_path / "input.onnx"
    upload.write_bytes(pack("tar.gz", {"llama/model.onnx": model_bytes, "llama/weights.bin": b"w" * 16}))
    model = extract(upload, "tar.gz", tmp_path / "unpacked", LIMITS)
    assert model == tmp_path / "unpacked" / "llama" / "model.onnx" and model.read_bytes() == model_bytes


def test_the_unpacked_limit_counts_every_member_together(tmp_path, model_bytes):
    upload = tmp_path / "input.onnx"
    upload.write_bytes(pack("tar", {"model.onnx": model_bytes, "a.bin": b"a" * 4000, "b.bin": b"b" * 4000}))
    with pytest.raises(ArchiveError, match="unpacked limit") as raised:
        check_upload(upload, ArchiveLimits(max_unpacked_bytes=len(model_bytes) + 6000))
    assert raised.value.member == "b.bin"


def test_too_many_members_are_refused(tmp_path, model_bytes):
    upload = tmp_path / "input.onnx"
    upload.write_bytes(pack("zip", {"model.onnx": model_bytes, **{f"{i}.bin": b"" for i in range(5)}}))
    with pytest.raises(ArchiveError, match="more than 4 members"):
        check_upload(upload, ArchiveLimits(max_members=4))


def test_an_archive_without_a_model_is_refused(tmp_path):
    upload = tmp_path / "input.onnx"
    upload.write_bytes(pack("zip", {"weights.bin": b"w"}))
    with pytest.raises(ArchiveError, match="exactly one .onnx model"):
        check_upload(upload, LIMITS)


def test_a_member_whose_data_outgrows_its_header_is_refused_while_unpacking(tmp_path, model_bytes):
    """A zip whose central directory understates a member: the listing passes, the bytes written do not."""
    data = bytearray(pack("zip", {"model.onnx": model_bytes, "weights.bin": b"w" * 100}))
    central = data.rindex(b"PK\x01\x02")  # the last central entry: weights.bin
    data[central + 24:central + 28] = (10).to_bytes(4, "little")  # its uncompressed size: 10 instead of 100
    upload = tmp_path / "input.onnx"
    upload.write_bytes(bytes(data))
    check_upload(upload, LIMITS)
    with pytest.raises(ArchiveError) as raised:
        extract(upload, "zip", tmp_path / "unpacked", LIMITS)
    assert raised.value.member == "weights.bin"


def test_a_plain_model_is_no_archive_even_with_ustar_where_tar_keeps_it(model_bytes):
    assert archive_kind(model_bytes) is None
    looks_like_tar = bytearray(512)
    looks_like_tar[257:262] = b"ustar"
    assert archive_kind(bytes(looks_like_tar)) is None  # the checksum does not hold


@pytest.mark.parametrize("upload, name", [("llama.tar.gz", "llama.opt.onnx"), ("llama.TGZ", "llama.opt.onnx"),
                                          ("m.zip", "m.opt.onnx"), ("m.tar", "m.opt.onnx"),
                                          ("det.onnx", "det.opt.onnx"), (".tar", "model.opt.onnx")])
def test_the_artifact_of_an_archive_is_named_after_it_without_the_archive_extension(upload, name):
    from worker.jobs.files import artifact_name

    assert artifact_name(upload) == name
