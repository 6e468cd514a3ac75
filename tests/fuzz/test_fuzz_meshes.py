"""Fuzz Topology construction (issue 29): device meshes of random dim names and sizes (the
frameworks' names, folded ones, unknown ones), sliced or flattened into a part of the job,
``axis_names`` right and wrong, ``partial`` and hostile values for every argument of
``from_device_mesh``, ``from_groups`` and ``with_groups``.

The contract: a valid topology (a grid over the mesh's ranks: sizes multiply to its size, the
axis groups meet only in this rank, and it is read as docs/wrapper.md says) or one
SeqpackError naming the value; and the wrapper refuses a topology over part of the job unless
it says ``partial=True``, naming the mesh to pass. One process plays any rank of any world on
torch's fake process group (no communication: meshes and groups only); a few cases run on 4
gloo ranks and must answer as the one-process run of the same rank did.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from hostile import HOSTILE, Target, check_answer
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.device_mesh import init_device_mesh

from seqpack.errors import ConfigError, SeqpackError
from seqpack.loader import PackingConfig
from seqpack.loader.construction import check_covers_job
from seqpack.options import AXES
from seqpack.topology import DP_DIM_NAMES, Topology

NAMES = (*AXES, *DP_DIM_NAMES[1:], "dp_shard_cp", "dp_cp", "world", "ep", "data", "x")


@contextlib.contextmanager
def fake_world(rank: int, world: int) -> Iterator[None]:
    """This process as ``rank`` of ``world`` on torch's fake backend (collectives are no-ops)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


# --- one case: build the mesh, slice it, read it -------------------------------------------


def build_mesh(case: dict) -> Any:
    mesh = init_device_mesh("cpu", tuple(case["sizes"]), mesh_dim_names=tuple(case["names"]))
    if case.get("flatten"):
        mesh = mesh[tuple(case["flatten"])]._flatten(mesh_dim_name=case.get("flat_name", "flat"))
    elif case.get("slice"):
        mesh = mesh[tuple(case["slice"])]
    return mesh


def reference_dims(names: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, list[str]] | None:
    """docs/wrapper.md's reading without axis_names: cp, tp, pp by name, every data-parallel
    dim into dp; None when a dim of size > 1 is none of these (refused)."""
    out: dict[str, list[str]] = {}
    for name, size in zip(names, sizes, strict=True):
        axis = "dp" if name in DP_DIM_NAMES else name if name in AXES else None
        if axis is None:
            if size > 1:
                return None
            continue
        out.setdefault(axis, []).append(name)
    return out


def read_case(case: dict) -> dict:
    """What this rank makes of ``case``: the topology's grid, or the error."""
    world, me = dist.get_world_size(), dist.get_rank()
    try:
        mesh = build_mesh(case)
    except (ValueError, RuntimeError, KeyError) as exc:  # torch refused the slice: not seqpack's business
        return {"torch": f"{type(exc).__name__}"}
    try:
        topology = Topology.from_device_mesh(
            mesh, axis_names=case.get("axis_names"), partial=case.get("partial", False)
        )
    except SeqpackError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    ranks = {axis: topology.global_ranks(axis) for axis in AXES}
    out = {"signature": topology.signature(), "ranks": ranks, "world": topology.world_size}
    out["hint"] = topology.mesh_hint
    try:
        check_covers_job(topology, PackingConfig(samples_per_rank=2, max_tokens_per_rank=64, prefetch=0), False)
        out["wrapper"] = "ok"
    except ConfigError as exc:
        out["wrapper"] = str(exc)
    out["mesh_size"], out["me"], out["job"] = int(mesh.size()), me, world
    out["mesh_ranks"] = [int(r) for r in mesh.mesh.reshape(-1).tolist()]
    return out


def check_read(case: dict, got: dict) -> str:
    """The contract for one rank's answer; returns which way it went."""
    if "torch" in got:
        return "torch"
    mentioned = [*case["names"], *(case.get("axis_names") or {}), "rank", "axis_names"]
    for dims in (case.get("axis_names") or {}).values():
        mentioned += [dims] if isinstance(dims, str) else list(dims)
    if "error" in got:
        message = got["error"]
        assert message.startswith(("ConfigError", "SeqpackTypeError")), message
        assert any(str(word) in message for word in mentioned), message
        final = [case.get("flat_name", "flat")] if case.get("flatten") else case.get("slice") or case["names"]
        twice = _mapped_twice(case.get("axis_names"), final)
        if twice is not None:  # the one mistake in axis_names: it names the dim
            assert f"axis_names maps mesh dim {twice!r} to" in message, message
        return "refused"
    signature, ranks, me = got["signature"], got["ranks"], got["me"]
    sizes = [signature[f"{axis}_size"] for axis in AXES]
    assert math.prod(sizes) == got["world"] == got["mesh_size"], got
    for axis in AXES:
        assert len(ranks[axis]) == signature[f"{axis}_size"], (axis, got)
        assert ranks[axis][signature[f"{axis}_rank"]] == me, (axis, got)
        assert set(ranks[axis]) <= set(got["mesh_ranks"]), (axis, got)
    for i, a in enumerate(AXES):
        for b in AXES[i + 1 :]:
            assert set(ranks[a]) & set(ranks[b]) == {me}, (a, b, got)
    if not case.get("axis_names") and not case.get("flatten") and not case.get("slice"):
        expected = reference_dims(tuple(case["names"]), tuple(case["sizes"]))
        assert expected is not None, (case, got)  # a dim the reading does not know was accepted
        for axis in AXES:
            size = math.prod(case["sizes"][case["names"].index(d)] for d in expected.get(axis, []))
            assert signature[f"{axis}_size"] == size, (axis, case, got)
    # The wrapper: the whole job, one rank, or partial=True run; any other part is refused,
    # naming the part and the mesh to pass.
    covers = got["world"] in (1, got["job"]) or case.get("partial")
    if covers:
        assert got["wrapper"] == "ok", got
    else:
        assert got["wrapper"].startswith(f"the topology spans {got['world']} of the {got['job']}"), got
        assert "partial=True" in got["wrapper"] and (got["hint"] or "whole job") in got["wrapper"], got
        assert got["hint"], got  # a sliced mesh: torch knows the mesh it came from
    return "read"


def _mapped_twice(axis_names: dict | None, names: list[str]) -> str | None:
    """The dim ``axis_names`` maps to two axes (or twice to one) when that is its only mistake."""
    if not axis_names or set(axis_names) - set(AXES):
        return None
    dims = [dim for value in axis_names.values() for dim in ((value,) if isinstance(value, str) else value)]
    if set(dims) - set(names):
        return None
    return next((dim for dim in dims if dims.count(dim) > 1), None)


# --- cases ---------------------------------------------------------------------------------


@st.composite
def mesh_cases(draw: st.DrawFn) -> dict:
    ndim = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(NAMES), min_size=ndim, max_size=ndim, unique=True))
    sizes = draw(st.lists(st.sampled_from((1, 1, 2, 2, 3)), min_size=ndim, max_size=ndim))
    case: dict[str, Any] = {"names": names, "sizes": sizes, "rank": 0}
    case["rank"] = draw(st.integers(0, math.prod(sizes) - 1))
    part = draw(st.sampled_from(("whole", "whole", "slice", "flatten")))
    if part != "whole":
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=ndim, unique=True))
        case[part] = [n for n in names if n in chosen]  # mesh order: torch wants it
        if part == "flatten":
            case["flat_name"] = draw(st.sampled_from(("flat", "dp")))
    if draw(st.booleans()):
        axes = draw(st.lists(st.sampled_from((*AXES, "ep")), min_size=1, max_size=3, unique=True))
        mapping: dict[str, Any] = {}
        for axis in axes:
            dims = draw(st.lists(st.sampled_from((*names, "flat", "dp", "nope")), min_size=1, max_size=2))
            mapping[axis] = dims[0] if len(dims) == 1 else tuple(dims)
        case["axis_names"] = mapping
    case["partial"] = draw(st.booleans())
    return case


@settings(max_examples=300)
@given(mesh_cases())
@pytest.mark.processes
def test_any_mesh_is_a_valid_topology_or_one_named_error(case):
    with fake_world(case["rank"], math.prod(case["sizes"])):
        check_read(case, read_case(case))


FRAMEWORKS = [
    # (names, sizes, slice or flatten of the part handed to seqpack), each on every rank of 4
    {"names": ["dp_replicate", "dp_shard"], "sizes": [2, 2], "slice": ["dp_shard"]},  # HSDP's shard mesh
    {"names": ["dp_replicate", "dp_shard"], "sizes": [2, 2], "slice": ["dp_replicate"]},
    # NeMo Automodel's flattened dp beside CP
    {
        "names": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
        "sizes": [1, 1, 2, 2, 1],
        "flatten": ["dp_replicate", "dp_shard"],
        "flat_name": "dp",
    },
    {"names": ["dp", "cp", "tp"], "sizes": [2, 2, 1], "slice": ["dp"]},  # Megatron-FSDP's dp
    {"names": ["dp", "cp", "tp"], "sizes": [2, 1, 2], "slice": ["dp", "cp"]},
    {"names": ["pp", "batch", "cp", "tp"], "sizes": [2, 2, 1, 1], "slice": ["batch"]},  # one stage's
    {"names": ["pp", "batch", "cp", "tp"], "sizes": [2, 2, 1, 1], "slice": ["batch"], "partial": True},
    {"names": ["dp_shard", "cp"], "sizes": [2, 2], "slice": ["dp_shard", "cp"]},  # the whole job, sliced
]


@pytest.mark.parametrize("case", FRAMEWORKS, ids=lambda c: "-".join(c.get("slice") or c.get("flatten")))
@pytest.mark.processes
def test_framework_parts_on_every_rank(case):
    for rank in range(4):
        with fake_world(rank, 4):
            got = read_case({**case, "rank": rank})
        assert check_read(case, got) == "read", got
        part = math.prod(case["sizes"][case["names"].index(d)] for d in case.get("slice") or case["flatten"])
        part = got["world"] if part == 1 else part
        assert got["world"] == part
        if part < 4 and not case.get("partial"):
            assert got["wrapper"].startswith("the topology spans 2 of the 4 initialised ranks"), got


@pytest.mark.processes
def test_a_rank_outside_the_mesh_is_named():
    from torch.distributed.device_mesh import DeviceMesh

    for rank in range(4):
        with fake_world(rank, 4):
            mesh = DeviceMesh("cpu", [0, 1], mesh_dim_names=("dp",))
            if rank < 2:
                assert Topology.from_device_mesh(mesh).dp_size == 2
                continue
            with pytest.raises(
                ConfigError, match=rf"this rank \({rank}\) is not in the device mesh \(its ranks: \[0, 1\]"
            ):
                Topology.from_device_mesh(mesh)


# --- hostile values for every argument -----------------------------------------------------


def _is(value: Any, token: str) -> bool:
    return isinstance(value, str) and value == token


def _mesh_target() -> Target:
    def call(mesh, axis_names, partial):
        with fake_world(1, 4):
            real = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp")) if _is(mesh, "mesh") else mesh
            return Topology.from_device_mesh(real, axis_names=axis_names, partial=partial)

    valid = lambda: {"mesh": "mesh", "axis_names": None, "partial": False}  # noqa: E731
    return Target("Topology.from_device_mesh", call, valid, {"mesh": "any", "axis_names": "any", "partial": "bool"})


def _groups_target() -> Target:
    def call(dp, cp, world_size, partial, with_groups):
        with fake_world(1, 4):
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
            dp = mesh.get_group("dp") if _is(dp, "dp") else dp
            cp = mesh.get_group("cp") if _is(cp, "cp") else cp
            topology = Topology.from_groups(dp=dp, cp=cp, world_size=world_size, partial=partial)
            if not _is(with_groups, "same"):
                topology.with_groups(with_groups)

    valid = lambda: {"dp": "dp", "cp": "cp", "world_size": None, "partial": False, "with_groups": "same"}  # noqa: E731
    args = {"dp": "any", "cp": "any", "world_size": "opt_int", "partial": "bool", "with_groups": "any"}
    return Target("Topology.from_groups", call, valid, args, aliases={"with_groups": ("groups",)})


TARGETS = [_mesh_target(), _groups_target()]
SPOILED = [(t, arg) for t in TARGETS for arg in t.args]


@pytest.mark.parametrize("target, arg", SPOILED, ids=[f"{t.name}.{a}" for t, a in SPOILED])
@pytest.mark.processes
def test_hostile_values_are_named(target, arg):
    answers = []
    for _, make in HOSTILE:
        value = make()
        if target.args[arg] == "opt_int" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            continue  # a world size: valid or a product mismatch, both checked elsewhere
        kwargs = {**target.valid(), arg: value}
        answers.append(check_answer(target, arg, value, kwargs))
    assert "refused" in answers, (target.name, arg)  # not vacuous


# --- the same cases on 4 gloo ranks ---------------------------------------------------------


def gloo_cases(cases: list[dict]) -> list[dict]:
    return [read_case(case) for case in cases]


def _sampled_cases(count: int) -> list[dict]:
    """Cases of 4 ranks in all (seeded: the same on every run)."""
    rng = random.Random(29)
    shapes = ([4], [2, 2], [1, 2, 2], [2, 1, 2], [4, 1])
    cases = []
    while len(cases) < count:
        sizes = list(rng.choice(shapes))
        names = rng.sample(NAMES, len(sizes))
        case: dict[str, Any] = {"names": names, "sizes": sizes, "partial": rng.random() < 0.3}
        if rng.random() < 0.5:
            case["slice"] = [n for n in names if rng.random() < 0.5] or [names[-1]]
        if rng.random() < 0.3:
            case["axis_names"] = {"dp": names[0]}
        cases.append(case)
    return cases


def test_gloo_ranks_answer_as_one_process_did(dist_pools):
    cases = FRAMEWORKS + _sampled_cases(16)
    results = dist_pools.get(4).run(gloo_cases, cases)
    outcomes = set()
    for rank, answers in enumerate(results):
        for case, got in zip(cases, answers, strict=True):
            with fake_world(rank, 4):
                expected = read_case(case)
            assert got == expected, (rank, case)
            outcomes.add(check_read(case, got))
    assert {"read", "refused"} <= outcomes, outcomes  # not vacuous
