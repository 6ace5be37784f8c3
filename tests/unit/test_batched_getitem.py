"""The batched form of ``__getitem__`` read from its source (NOTE [ Batched getitem from source ]).

Each supported dataset's batched form must equal ``default_collate`` of its per-sample items,
leaf by leaf (type, dtype, shape, values); each unsupported one must have no batched form; and
wherever one sample's code would raise or could differ, the form must decline.
"""

from __future__ import annotations

import functools
import linecache

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from stoker.collate import default_collate
from stoker.fastpaths.batched_getitem import Decline, compile_batched
from stoker.fastpaths.index_tensor import same_batch

N = 50
_g = torch.Generator().manual_seed(0)
X = torch.randn(N, 4, generator=_g)
Y = torch.randint(-5, 1000, (N,), generator=_g)
Z = np.random.default_rng(0).random((N, 3)).astype(np.float32)
W = np.arange(N, dtype=np.int16)
F = torch.randn(N, generator=_g) * 100
U8 = torch.randint(0, 256, (N, 2, 2), dtype=torch.uint8, generator=_g)
NAMES = [f"img_{i}.jpg" for i in range(N)]


class _Base(Dataset):
    def __init__(self) -> None:
        self.x, self.y, self.z, self.w, self.f, self.u8 = X, Y, Z, W, F, U8
        self.names, self.pairs = NAMES, tuple((i, -i) for i in range(N))

    def __len__(self) -> int:
        return N


class DictInt(_Base):
    def __getitem__(self, index):
        return {"x": self.x[index], "y": int(self.y[index])}


class TupleNumpy(_Base):
    def __getitem__(self, idx):
        """A docstring, then assignments."""
        z = torch.from_numpy(self.z[idx])
        label = float(self.w[idx])
        return z.float() * 2, label, self.names[idx]


class Scalars(_Base):
    def __getitem__(self, i):
        return [self.y[i].item(), self.f[i].item(), bool(self.y[i]), int(self.f[i]),
                self.w[i].item(), float(self.y[i])]


class Images(_Base):
    def __getitem__(self, i):
        return {"img": self.u8[i].float() / 255, "shifted": 1 - self.x[i], "raw": self.u8[i]}


class NumpyRows(_Base):
    def __getitem__(self, i):
        return {"z": self.z[i].astype("float64"), "z2": self.z[i].copy(), "w": self.w[i],
                "zt": torch.as_tensor(self.z[i]), "pair": self.pairs[i]}


class Identity(_Base):
    def __getitem__(self, index):
        return index


class IndexTensors(_Base):
    def __getitem__(self, i):
        return {"i": torch.tensor(i), "f": torch.as_tensor(float(self.y[i])), "j": i}


class Arithmetic(_Base):
    def __getitem__(self, i):
        return {
            "mod": i % 7, "floordiv": i // 3, "neg": -i, "half": i / 2, "rev": 100 - i,
            "rdiv": 7 // (i + 1), "rtrue": 1 / (i + 1), "ymod": int(self.y[i]) % -4,
            "yf": float(self.y[i]) * 0.5 - 3, "bool": bool(self.y[i]) + 1,
            "negbool": -bool(self.y[i]), "fneg": -float(self.f[i]), "mixed": i * 1.5,
            "negx": -self.x[i], "xto": self.x[i].to(torch.float64), "u8mod": self.u8[i] % 5,
            "xfloordiv": self.x[i] // 0.5, "u8to": self.u8[i].to(torch.int16) - 300,
        }


class TensorPair(torch.utils.data.TensorDataset):
    """torch's own ``tuple(tensor[index] for tensor in self.tensors)``."""

    def __init__(self) -> None:
        super().__init__(X, Y)


class EachArray(_Base):
    def __init__(self) -> None:
        super().__init__()
        self.arrays = (X, Z, W)

    def __getitem__(self, idx):
        return {"t": tuple(a[idx] for a in self.arrays), "l": list(b[idx] for b in self.arrays)}


SUPPORTED = [
    DictInt, TupleNumpy, Scalars, Images, NumpyRows, Identity, IndexTensors, Arithmetic,
    TensorPair, EachArray,
]


def _plain(ds, indices):
    return default_collate([ds[i] for i in indices])


@pytest.mark.parametrize("cls", SUPPORTED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("indices", [[0], [3, 7, 1, 49], [5, 5, 5], list(range(N))])
def test_batched_form_equals_default_collate_of_the_samples(cls, indices):
    ds = cls()
    batched = compile_batched(ds)
    assert batched is not None, f"{cls.__name__} should have a batched form"
    assert same_batch(_plain(ds, indices), batched(indices))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, N - 1), min_size=1, max_size=64),
       st.sampled_from(SUPPORTED))
def test_batched_form_equals_for_any_indices(indices, cls):
    ds = cls()
    assert same_batch(_plain(ds, indices), compile_batched(ds)(indices))


def test_int_of_floats_truncates_toward_zero_like_int():
    class Labels(Dataset):
        def __init__(self):
            self.v = torch.tensor([-2.7, -0.5, 0.5, 2.7, 1e10])

        def __getitem__(self, i):
            return int(self.v[i])

    ds = Labels()
    got = compile_batched(ds)([0, 1, 2, 3, 4])
    assert got.dtype == torch.int64
    assert got.tolist() == [-2, 0, 0, 2, 10_000_000_000]


def test_batched_form_rereads_attributes_each_batch():
    ds = DictInt()
    batched = compile_batched(ds)
    ds.x = X * 0  # the dataset changed between batches: the next batch sees it
    assert same_batch(_plain(ds, [1, 2]), batched([1, 2]))


# -- no batched form --------------------------------------------------------------------------


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)

    return wrapper


def _helper(v):
    return v


int_ = int


class Branch(_Base):
    def __getitem__(self, i):
        if i > 3:
            return self.x[i]
        return self.x[0]


class CallsHelper(_Base):
    def __getitem__(self, i):
        return _helper(self.x[i])


class Decorated(_Base):
    @_decorated
    def __getitem__(self, i):
        return self.x[i]


class Augments(_Base):
    def __getitem__(self, i):
        return self.x[i] + torch.randn(4)


class IndexArithmetic(_Base):
    def __getitem__(self, i):
        return self.x[i + 1]


class ShadowedInt(_Base):
    def __getitem__(self, i):
        int = float  # noqa: A001 - the point of the test
        return int(self.y[i])


class MutatesState(_Base):
    def __getitem__(self, i):
        self.last = i
        return self.x[i]


class VarArgs(_Base):
    def __getitem__(self, *args):
        return self.x[args[0]]


class BuiltinGetitem(torch.utils.data.TensorDataset):
    pass


def _make_closure():
    scale = 2.0

    class Closure(_Base):
        def __getitem__(self, i):
            return self.x[i] * scale

    return Closure


@pytest.mark.parametrize(
    "cls",
    [Branch, CallsHelper, Decorated, Augments, IndexArithmetic, ShadowedInt, MutatesState,
     VarArgs, _make_closure()],
    ids=lambda c: c.__name__,
)
def test_other_forms_have_no_batched_form(cls):
    assert compile_batched(cls()) is None


def test_a_dataset_without_python_getitem_has_no_batched_form():
    assert compile_batched(X) is None


def test_tensor_dataset_gathers_each_tensor_and_declines_other_items():
    ds = BuiltinGetitem(X, Y)  # a subclass that keeps TensorDataset's __getitem__
    assert same_batch(_plain(ds, [4, 1]), compile_batched(ds)([4, 1]))
    ds.tensors = (X, list(range(N)))  # not an array: one sample at a time
    with pytest.raises(Decline):
        compile_batched(ds)([4, 1])


def test_a_global_bound_to_int_is_not_trusted_by_name():
    # ``int_`` is int itself: resolved through the function's globals, it is accepted.
    class Aliased(_Base):
        def __getitem__(self, i):
            return int_(self.y[i])

    assert compile_batched(Aliased()) is not None


# -- declines: the batch is fetched sample by sample ------------------------------------------


def _declines(ds, indices):
    batched = compile_batched(ds)
    assert batched is not None
    with pytest.raises(Decline):
        batched(indices)


def test_declines_indices_that_are_not_plain_ints():
    _declines(DictInt(), [np.int64(1), 2])
    _declines(DictInt(), [True, 2])
    _declines(DictInt(), [1.0, 2])
    _declines(DictInt(), [])


def test_declines_negative_and_out_of_range_indices():
    _declines(DictInt(), [1, -1])
    _declines(DictInt(), [1, N])
    with pytest.raises(IndexError):  # what one sample at a time then says
        DictInt()[N]


def test_declines_int_of_values_int_would_refuse():
    class Nan(_Base):
        def __getitem__(self, i):
            return int(self.f[i])

    ds = Nan()
    ds.f = torch.tensor([1.0, float("nan")])
    _declines(ds, [0, 1])
    assert compile_batched(ds)([0]).tolist() == [1]


def test_declines_a_scalar_of_a_sample_with_several_values():
    class Several(_Base):
        def __getitem__(self, i):
            return int(self.x[i])  # x[i] has 4 values: int() raises for one sample

    _declines(Several(), [0, 1])
    with pytest.raises(ValueError, match="one element"):
        Several()[0]


def test_declines_sources_that_stop_being_cpu_arrays():
    ds = DictInt()
    batched = compile_batched(ds)
    ds.x = {i: X[i] for i in range(N)}  # a dict: sample indexing works, a gather would not
    with pytest.raises(Decline):
        batched([0, 1])
    ds.x = X.clone().requires_grad_()
    with pytest.raises(Decline):
        batched([0, 1])


def test_declines_attributes_that_run_code():
    class Computed(_Base):
        @property
        def rows(self):
            return self.x

        def __getitem__(self, i):
            return self.rows[i]

    _declines(Computed(), [0, 1])


def _dataset_returning(expr: str) -> Dataset:
    """A dataset whose ``__getitem__`` is ``return <expr>`` (its source is what is compiled)."""
    code = f"class Case(_Base):\n    def __getitem__(self, i):\n        return {expr}\n"
    filename = f"<case {expr}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace: dict = {"torch": torch, "_Base": _Base}
    exec(compile(code, filename, "exec"), namespace)
    ds = namespace["Case"]()
    ds.big = torch.tensor([2**62 + 1, -(2**62) - 1])
    return ds


@pytest.mark.parametrize(
    ("expr", "indices"),
    [
        ("i / 0", [1, 2]),  # ZeroDivisionError per sample
        ("1 / i", [3, 0]),
        ("i % 0", [1]),
        ("5 // i", [0, 4]),
        ("float(self.f[i]) / 0", [1]),
        ("int(self.big[i]) * 4", [0, 1]),  # beyond int64: Python ints do not wrap
        ("int(self.big[i]) % 3", [0]),  # near int64's ends
        ("int(self.big[i]) / 3", [0]),  # not exact as a float
        ("float(self.f[i]) % 2", [1]),  # float % has its own sign rules
        ("self.f[i].to(torch.int64)", [1]),  # float -> int cast
    ],
)
def test_declines_arithmetic_python_would_compute_differently(expr, indices):
    batched = compile_batched(_dataset_returning(expr))
    assert batched is not None, expr
    with pytest.raises(Decline):
        batched(indices)


def test_declines_float_to_int_tensor_casts():
    class LongOfFloat(_Base):
        def __getitem__(self, i):
            return self.f[i].long()

    _declines(LongOfFloat(), [0, 1])


def test_batched_gathers_write_into_the_current_allocator():
    from stoker.collate import allocating_into

    class Recorder:
        def __init__(self):
            self.given = []

        def empty(self, shape, dtype):
            out = torch.empty(shape, dtype=dtype)
            self.given.append(out)
            return out

    ds = DictInt()
    rec = Recorder()
    with allocating_into(rec):
        batch = compile_batched(ds)([4, 2, 9])
    assert batch["x"].data_ptr() == rec.given[0].data_ptr()
    assert torch.equal(batch["x"], X[[4, 2, 9]])


def test_a_workers_read_only_list_is_read_item_by_item():
    from stoker.sharing.read_only import ReadOnlySequence

    class StandIn(ReadOnlySequence):
        def __init__(self, items):
            self._items, self._len = items, len(items)

        def _get(self, i):
            return self._items[i]

    ds = TupleNumpy()
    ds.names = StandIn(NAMES)
    assert same_batch(_plain(ds, [4, 0]), compile_batched(ds)([4, 0]))
