"""kiln.Tensor and DLPack both ways: shared memory for C-contiguous data, one copy for
strided data, versioned and legacy capsules, capsules dropped unconsumed, and errors."""

import gc
from pathlib import Path

import numpy as np
import pytest

import kiln

# Two f32[N] inputs and their sum: the smallest graph a run can take.
ADD = (Path(__file__).parent / "add.kir").read_text()


def address(array):
    return array.__array_interface__["data"][0]


class Capsule:
    """Hands numpy (or kiln) one capsule made beforehand."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


class LegacyOnly:
    """A producer from before DLPack 1.0: its __dlpack__ takes no max_version."""

    def __init__(self, obj):
        self.obj = obj

    def __dlpack__(self, stream=None):
        return self.obj.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_contiguous_arrays_round_trip_without_a_copy():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = kiln.Tensor(a)
    assert t.shape == (2, 3) and t.dtype == "float64"
    assert t.data_ptr == address(a)
    back = t.numpy()
    assert address(back) == address(a)
    a[1, 2] = 42.0  # one memory: the view sees the write
    assert back[1, 2] == 42.0
    del a, t
    gc.collect()
    np.testing.assert_array_equal(back, [[0, 1, 2], [3, 4, 42]])
    assert "shape=(2, 3)" in repr(kiln.Tensor(back))


def test_numpy_from_dlpack_shares_kilns_memory_past_the_tensor():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kiln.Tensor(a.T)  # strided: copied into Kiln's memory
    assert t.data_ptr != address(a)
    viewed = np.from_dlpack(t)
    assert address(viewed) == t.data_ptr
    assert t.__dlpack_device__() == (1, 0)
    del t
    gc.collect()
    np.testing.assert_array_equal(viewed, a.T)  # the export keeps the memory
    assert viewed.flags.c_contiguous and viewed.shape == (4, 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: a[::-1],
        lambda a: a[1:, 1:3],
    ],
    ids=["transposed", "every_other_column", "reversed_rows", "offset_window"],
)
def test_strided_arrays_are_copied_once_in_order(make):
    a = np.arange(20, dtype=np.int32).reshape(4, 5)
    view = make(a)
    t = kiln.Tensor(view)
    base = address(a)
    assert not base <= t.data_ptr < base + a.nbytes, "strided data must be copied"
    assert t.shape == view.shape and t.dtype == "int32"
    expected = view.copy()
    a[...] = -1  # the copy is the tensor's own
    np.testing.assert_array_equal(t.numpy(), expected)


def test_legacy_capsules_both_ways():
    a = np.arange(5, dtype=np.int64)
    t = kiln.Tensor(a)
    capsule = t.__dlpack__()
    assert 'capsule object "dltensor"' in repr(capsule)
    del capsule
    viewed = np.from_dlpack(LegacyOnly(t))
    assert address(viewed) == t.data_ptr == address(a)
    # A legacy producer into Kiln: numpy's unversioned capsule, shared too.
    from_legacy = kiln.from_dlpack(LegacyOnly(a))
    assert from_legacy.data_ptr == address(a)
    np.testing.assert_array_equal(from_legacy.numpy(), a)


def test_consumed_capsules_are_marked_used():
    t = kiln.Tensor(np.ones(3, np.float32))
    capsule = t.__dlpack__(max_version=(1, 0))
    assert 'capsule object "dltensor_versioned"' in repr(capsule)
    other = kiln.from_dlpack(Capsule(capsule))
    assert 'capsule object "used_dltensor_versioned"' in repr(capsule)
    assert other.data_ptr == t.data_ptr
    with pytest.raises(kiln.InvalidArgument, match="not an unused"):
        kiln.from_dlpack(Capsule(capsule))  # a used capsule cannot be read twice
    legacy = t.__dlpack__(max_version=(0, 8))
    viewed = np.from_dlpack(Capsule(legacy))
    assert 'capsule object "used_dltensor"' in repr(legacy)
    assert address(viewed) == t.data_ptr


def test_unconsumed_capsules_free_the_memory():
    # 4 MiB of Kiln's memory each round; a leak would grow the RSS by 200 MiB.
    big = np.ones((1024, 2048), np.float32)[:, ::2]
    before = rss_kib()
    for round in range(50):
        t = kiln.Tensor(big)  # a copy in Kiln's memory
        versioned = t.__dlpack__(max_version=(1, 0))
        legacy = t.__dlpack__()
        del t  # the capsules hold the memory now
        if round % 2:
            del versioned, legacy
        else:
            del legacy, versioned
        gc.collect()
    grown = rss_kib() - before
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB"


def test_copy_true_exports_a_copy_and_says_so():
    t = kiln.Tensor(np.arange(4, dtype=np.float32))
    copied = np.from_dlpack(t, copy=True)
    assert address(copied) != t.data_ptr
    np.testing.assert_array_equal(copied, [0, 1, 2, 3])
    shared = np.from_dlpack(t, copy=False)
    assert address(shared) == t.data_ptr


def test_read_only_arrays_stay_read_only():
    a = np.arange(4, dtype=np.uint8)
    a.flags.writeable = False
    t = kiln.Tensor(a)
    assert t.data_ptr == address(a)
    assert not t.numpy().flags.writeable
    assert not np.from_dlpack(t).flags.writeable


def test_dtypes_bool_and_lists():
    flags = kiln.Tensor(np.array([True, False, True]))
    assert flags.dtype == "bool"
    np.testing.assert_array_equal(np.from_dlpack(flags), [True, False, True])
    listed = kiln.Tensor([[1.5, 2.5]])
    assert listed.shape == (1, 2) and listed.dtype == "float64"
    scalar = kiln.Tensor(np.float16(3))
    assert scalar.shape == () and scalar.numpy() == 3


def test_runs_read_kiln_tensors():
    exe = kiln.parse(ADD).compile()
    a = np.arange(6, dtype=np.float32)
    t = kiln.Tensor(a)
    np.testing.assert_array_equal(exe(a=t, b=t)["sum"], 2 * a)
    (y,) = exe.run_list(None, {"a": t, "b": a})
    np.testing.assert_array_equal(y, 2 * a)
    # Another dtype is converted as an array of it would be: refused here.
    with pytest.raises(kiln.RunBadInput, match="tensor\\(float\\)"):
        exe(a=kiln.Tensor(a.astype(np.int32)), b=a)


def test_errors_are_kiln_errors_naming_the_argument():
    with pytest.raises(kiln.InvalidArgument, match="obj: expected an object with __dlpack__"):
        kiln.from_dlpack([1, 2])
    with pytest.raises(kiln.Unsupported, match="kDLComplex with 128 bits"):
        kiln.Tensor(np.array([1 + 2j]))  # the capsule is left to delete itself
    with pytest.raises(kiln.Unsupported, match="obj: its __dlpack__ failed"):
        kiln.Tensor(np.array(["text"]))
    t = kiln.Tensor(np.zeros(2, np.float32))
    with pytest.raises(kiln.Unsupported, match="dl_device"):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(kiln.Unsupported, match="stream"):
        t.__dlpack__(stream=1)
    for error in (kiln.InvalidArgument, kiln.Unsupported):
        assert issubclass(error, kiln.KilnError)
    gc.collect()
