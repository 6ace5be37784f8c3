"""The seams between stoker's parts hold (NOTE [ One plan ] in ``stoker._core.plan``):

* the engine, device feed, profiler and everything else below the loader never take the
  loader: they are given the pass's ``Plan`` and the loader's ``EngineState``. Above it (the
  doctor, the demo, ``stoker.testing``) a loader is used as a user uses it: public attributes
  and methods only;
* no module reads another module's private attribute (``obj._name`` where ``_name`` is not
  defined in the reading module); the internals of other libraries stoker must read are
  listed below, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import stoker

ROOT = Path(stoker.__file__).parent
# Where the loader is built and where frameworks hand stoker theirs.
TAKES_LOADER = ("loader.py", "integrations/")
# Above the loader: code that drives a user's loader as the user would.
USES_LOADER = ("doctor/", "cli/", "testing/")

# Other libraries' internals stoker reads, with why (module, the attribute read).
THIRD_PARTY = {
    ("formats/pack_writer.py", "_exit"): "os._exit: a forked pack worker ends without atexit "
                                         "handlers",
    ("workers/entry.py", "_exit"): "os._exit: a worker process ends as torch's workers end",
    ("workers/entry.py", "_set_thread_name"): "torch's worker names its thread pt_data_worker "
                                              "(NOTE [ The worker's process is torch's ])",
    ("integrations/accelerate.py", "_getframe"): "the adapter that rebuilt the loader, from "
                                                 "the stack (NOTE [ Accelerate keeps stoker ])",
    ("integrations/accelerate.py", "_auto_collation"): "torch's DataLoader property read on a "
                                                       "loader Accelerate rebuilds",
    ("engine/rank_state.py", "_getframe"): "the framework loading a state, from the stack "
                                           "(NOTE [ Every rank's part ]): advice that fits",
    ("_core/torch_voice.py", "_getframe"): "the first frame outside stoker, where torch's "
                                           "__next__ attributes its warning",
    ("engine/base_iter.py", "_BaseDataLoaderIter"): "NOTE [ torch's iterator classes ]",
    ("engine/inline_iter.py", "_SingleProcessDataLoaderIter"): "the same",
    ("engine/process_iter.py", "_MultiProcessingDataLoaderIter"): "the same",
    ("_core/forked_copies.py", "_MultiProcessingDataLoaderIter"): "NOTE [ A forked copy of a "
                                                                 "live iterator says what "
                                                                 "torch's says ]",
    ("_core/torch_modes.py", "_autograd"): "torch.profiler's enabled check "
                                           "(torch._C._autograd)",
    ("sampling/global_rngs.py", "_rand"): "numpy's global RandomState",
    ("sampling/global_rngs.py", "_bit_generator"): "numpy's global RandomState's generator",
    ("_core/process_exit.py", "_register_atexit"): "the hook that runs before atexit's: NOTE "
                                                   "[ A download gives up at exit ], NOTE "
                                                   "[ Workers at interpreter exit ]",
    ("storage/remote.py", "_strip_protocol"): "fsspec's path normalisation",
    ("transport/slab_reader.py", "_utils"): "torch's sparse-tensor validation after rebuild",
    ("transport/slab_reader.py", "_sparse_tensors_to_validate"): "as torch's unpickler does",
    ("transport/slab_reader.py", "_validate_loaded_sparse_tensors"): "as torch's unpickler does",
    ("transport/torch_way.py", "_share_fd_cpu_"): "NOTE [ Batches cross as torch's do ]",
    ("transport/reused_shm.py", "_C"): "torch._C._storage_Use_Count: whether anything but "
                                       "stoker holds a storage (NOTE [ torch's shared memory, "
                                       "reused ])",
    ("transport/reused_shm.py", "_storage_Use_Count"): "the same",
    ("transport/reused_shm.py", "_cdata"): "the storage handle _storage_Use_Count takes",
    ("transport/reused_shm.py", "_StorageBase"): "torch's own _new_shared, called for what is "
                                                 "not a reused segment",
    ("transport/reused_shm.py", "_share_fd_cpu_"): "a segment's fd, sent once (NOTE [ Batches "
                                                   "cross as torch's do ])",
    ("transport/reused_shm.py", "_new_shared_fd_cpu"): "the storage torch's rebuild_storage_fd "
                                                       "makes from an fd",
    ("transport/reused_shm.py", "_typed_storage"): "the self-check allocates as torch's "
                                                   "collate_tensor_fn does",
    ("_core/torch_own.py", "_C"): "torch._C._VariableFunctions: torch's own C functions, to "
                                  "tell a program's rebinding of torch.stack or torch.randperm "
                                  "(NOTE [ torch's own functions ])",
    ("_core/torch_own.py", "_VariableFunctions"): "the same",
    ("_core/torch_own.py", "_tensor"): "torch._tensor: the module defining torch.Tensor's "
                                       "Python methods (the same NOTE)",
    ("fastpaths/torch_gather.py", "_new_shared"): "as torch's collate_tensor_fn does in a worker",
    ("loader.py", "_reset"): "a subclass's own iterator, reset as torch's __iter__ resets it "
                             "(DataLoader._subclass_iter)",
    ("_core/torch_modes.py", "_C"): "torch's mode stacks, and the guards that hide stoker's "
                                    "own calls from them (NOTE [ The program's torch modes see "
                                    "torch's calls ])",
    ("_core/torch_modes.py", "_len_torch_function_stack"): "an active TorchFunctionMode",
    ("_core/torch_modes.py", "_len_torch_dispatch_stack"): "an active TorchDispatchMode",
    ("_core/torch_modes.py", "_DisableTorchDispatch"): "hides stoker's calls from an active "
                                                       "TorchDispatchMode (the same NOTE)",
    ("vision/transforms/_fused_tensor.py", "_C"): "torch's antialiased resize with explicit "
                                                  "scales (interpolate takes a size or a scale)",
    ("vision/transforms/_fused_tensor.py", "_nn"): "the same op: torch._C._nn._upsample_*_aa",
    ("workers/spec_once.py", "_extra_reducers"): "torch's reductions registered on "
                                                 "ForkingPickler, copied to a private pickler",
    ("transport/torch_way.py", "_extra_reducers"): "a ForkingPickler whose table is the shared "
                                                   "one is given a copy before it is changed",
}
# namedtuple's public API is spelled with an underscore.
NAMEDTUPLE = {"_replace", "_fields", "_asdict", "_make"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(ROOT)), ast.parse(p.read_text(), str(p)))
            for p in sorted(ROOT.rglob("*.py"))]


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def _takes_loader(arg: ast.arg) -> bool:
    annotation = ast.unparse(arg.annotation) if arg.annotation else ""
    # torchvision's ``loader`` (stoker.vision's datasets) is a function reading one image file
    image_reader = annotation.startswith("Callable[[str]")
    return (arg.arg == "loader" and not image_reader) or "DataLoader" in annotation


def test_nothing_below_the_loader_takes_the_loader() -> None:
    found = []
    for rel, tree in _modules():
        if rel.startswith(TAKES_LOADER + USES_LOADER):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{rel}: {node.name}({arg.arg})" for arg in _params(node)
                          if _takes_loader(arg)]
    assert not found, f"give these the Plan and the EngineState, not the loader: {found}"


def test_code_above_the_loader_uses_only_its_public_face() -> None:
    found = []
    for rel, tree in _modules():
        if not rel.startswith(USES_LOADER):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "loader" and node.attr.startswith("_")):
                found.append(f"{rel}:{node.lineno}: loader.{node.attr}")
    assert not found, f"use the loader's public methods (plan(), stats(), ...): {found}"


def _own_names(tree: ast.Module) -> set[str]:
    """Names a module defines: its functions and classes, attributes it assigns, globals."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    return own


def _is_self(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "super")


def test_no_module_reads_another_modules_private_attribute() -> None:
    found, unused = [], set(THIRD_PARTY)
    for rel, tree in _modules():
        own = _own_names(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if _is_self(node.value) or node.attr in own | NAMEDTUPLE:
                continue
            if (rel, node.attr) in THIRD_PARTY:
                unused.discard((rel, node.attr))
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, f"read through a public name of the owning module: {found}"
    assert not unused, f"no longer read: drop from THIRD_PARTY: {sorted(unused)}"


def test_the_check_sees_a_private_read() -> None:
    """The scan is not vacuous: a planted read of another module's private is found."""
    tree = ast.parse("def f(loader):\n    return loader._engine\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    assert node.attr.startswith("_") and node.attr not in _own_names(tree)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert _takes_loader(_params(fn)[0])
