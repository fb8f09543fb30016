"""Places: parsing with errors that name the bad part, priority order, and Paddle-Lite's host fallback."""
import pytest

from worker.engine.errors import PlaceError
from worker.engine.places import (ARM, HOST, OPENCL, X86, Layout, Place, Precision, parse_places, register_target,
                           unregister_target)


def test_parse_and_print_round_trip():
    place = Place.parse("arm/fp16/nhwc")
    assert (place.target, place.precision, place.layout) == (ARM, Precision.FP16, Layout.NHWC)
    assert str(place) == "arm/fp16/nhwc"
    assert str(Place.parse(" X86 ")) == "x86/fp32/nchw"  # precision and layout default to fp32, nchw


@pytest.mark.parametrize("text, message", [
    ("gpu/fp32/nchw", "bad target 'gpu' in place 'gpu/fp32/nchw'; allowed: host, x86, arm, cuda, opencl, npu"),
    ("arm/fp64/nchw", "bad precision 'fp64' in place 'arm/fp64/nchw'; allowed: fp32, fp16, int8, int32, "
                      "int64, bool, any"),
    ("arm/fp16/nc", "bad layout 'nc' in place 'arm/fp16/nc'; allowed: nchw, nhwc, any"),
    ("arm/fp16/nhwc/x", "expected target/precision/layout"),
    ("arm//nchw", "expected target/precision/layout"),
])
def test_bad_place_names_the_bad_part_and_the_allowed_values(text, message):
    with pytest.raises(PlaceError) as error:
        Place.parse(text)
    assert message in str(error.value)
    assert error.value.field == "places"


def test_valid_places_keep_priority_and_append_host_fallbacks():
    places = parse_places("arm/fp16/nhwc,arm/fp32/nchw,arm/fp16/nhwc")
    assert [str(p) for p in places] == ["arm/fp16/nhwc", "arm/fp32/nchw", "host/fp16/nhwc", "host/fp32/nchw"]
    assert places.user_count == 2
    assert places.weight(places.places[0]) == 1.0 and places.weight(places.places[-1]) == 0.25


def test_opencl_places_get_no_host_twin_but_one_host_place_remains():
    places = parse_places("opencl/fp16/nchw")
    assert [str(p) for p in places] == ["opencl/fp16/nchw", "host/fp32/nchw"]
    assert [str(p) for p in parse_places("opencl/fp16/nchw,arm/fp32/nchw")] == \
        ["opencl/fp16/nchw", "arm/fp32/nchw", "host/fp32/nchw"]


def test_no_host_fallback_and_default():
    assert [str(p) for p in parse_places("arm/fp32/nchw", host_fallback=False)] == ["arm/fp32/nchw"]
    assert [str(p) for p in parse_places(None)] == ["x86/fp32/nchw", "host/fp32/nchw"]


def test_memory_sharing_follows_paddle_lite():
    assert HOST.shares_memory_with(X86) and X86.shares_memory_with(ARM)
    assert not ARM.shares_memory_with(OPENCL)


def test_targets_are_extensible_and_clashes_refused():
    target = register_target("dsp", description="a test DSP", origin="test plugin")
    try:
        assert str(Place.parse("dsp/int8/nhwc")) == "dsp/int8/nhwc"
        assert target.memory_space == "dsp"
        with pytest.raises(ValueError, match="already registered by test plugin"):
            register_target("dsp")
    finally:
        unregister_target("dsp")
    with pytest.raises(PlaceError):
        Place.parse("dsp")
