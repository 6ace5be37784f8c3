"""``torch.distributed.checkpoint`` across 2 processes (gloo): save a ``shard=True`` loader
mid-epoch, load it into a fresh one, and the epoch continues exactly, on every rank with its
own seeds; a state every rank saved under one key (DCP keeps one copy of each value, from any
rank) is refused, with the per-rank recipe, where it is not the rank's own."""

from __future__ import annotations

from pathlib import Path

from _launch import records, run

PER_RANK = (
    "torch.distributed.checkpoint keeps one copy of each value that every rank saves under "
    "the same key, taken from any rank, so dcp.save({'loader': loader}) gives every rank a "
    "mix of the ranks' states: save each rank's under its own key, "
    "dcp.save({f'loader_rank{rank}': loader, ...}) and dcp.load({f'loader_rank{rank}': "
    "loader, ...}) with rank = torch.distributed.get_rank()."
)


def another_ranks(saved: int, rank: int) -> str:
    return (
        f"load_state_dict: this state was saved by rank {saved} of 2 and has no part for this "
        f"process, rank {rank}. A loader's state belongs to the rank that saved it (the base "
        "seed and generator states it drew, its workers' and dataset's progress): loaded here, "
        f"rank {rank} would go on with rank {saved}'s seeds, which is right only if every rank "
        "seeded its loader alike. " + PER_RANK
    )


def mixed(saved: int) -> str:
    return (
        "load_state_dict: this state is not the state of one rank: its fields do not match "
        f"the digest rank {saved} of 2 saved with them, so some come from another rank (or "
        "were edited). A loader's state belongs to the rank that saved it (the base seed and "
        "generator states it drew, its workers' and dataset's progress). " + PER_RANK
    )


def test_dcp_save_mid_epoch_load_into_a_fresh_loader_per_rank(tmp_path: Path) -> None:
    run("dcp_run.py", tmp_path, nproc=2)
    ranks = records(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    seeds = [{seed for b in r["reference"] for _, seed in b} for r in ranks]
    assert len(seeds[0]) == len(seeds[1]) == 1 and seeds[0] != seeds[1]  # one worker each
    for r in ranks:
        assert len(r["before"]) == 2
        assert r["before"] + r["after"] == r["reference"]
    assert sorted(i for r in ranks for b in r["reference"] for i, _ in b) == list(range(22))
    # Saved under one key: DCP keeps one copy of each value, each from any rank. A rank that
    # got its own whole state resumes exactly; one that got a mix, or another rank's whole
    # state, refuses it with the per-rank recipe (another rank's went on with that rank's
    # seeds, with a warning, before).
    outcomes = [r["one_key"] for r in ranks]
    refusals = {mixed(0), mixed(1)}
    for rank, got in enumerate(outcomes):
        own = {"warned": [], "after": ranks[rank]["reference"][2:]}
        assert got == own or got.get("refused") in refusals | {another_ranks(1 - rank, rank)}, (
            rank, got)
    assert any(got != {"warned": [], "after": ranks[rank]["reference"][2:]}
               for rank, got in enumerate(outcomes))  # the ranks saved different values
