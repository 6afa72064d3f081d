"""The loader's resumable state: a small versioned dict of plain ints and strings
(`make_state`), and the check that a saved state fits this run (`check_state`), whose errors
say what differs and how to go on."""

from __future__ import annotations

from tbljax._src.rules.contract import is_integer
from tbljax._src.rules.order import check_seed_epoch

__all__ = ["STATE_VERSION", "check_state", "make_state"]

STATE_VERSION = 1
_STATE_KEYS = ("version", "seed", "epoch", "position", "fingerprint")


def make_state(
    *,
    seed: int,
    epoch: int,
    position: int,
    fingerprint: str,
    processes: int | None = None,
    mixture: dict | None = None,
    repeats: int = 1,
    buckets: dict | None = None,
    packing: dict | None = None,
) -> dict:
    """The resumable state: a small versioned dict of plain ints and strings. A
    partition="host" loader gives `processes` (P): its state also says ``"partition":
    "host"`` and P, and its position is the local position of every part. A mixture's loader
    gives `mixture` (`Mixture.description`: sources, weights, label offsets, epoch, the sources'
    fingerprints), kept under ``"mixture"`` so that a state of another mixture is refused
    saying what differs. With `repeats` > 1 the state says so (its positions count k·N an epoch).
    A bucketed loader gives `buckets` ({sizes, global_batch}: what its steps depend on), kept
    under ``"buckets"``; its position is the steps handed out times the global batch. A loader of
    packed NaFlex sequences gives `packing` ({max_tokens, image_tokens, pack_window}), kept under
    ``"packing"``; its position counts sequences.

    >>> make_state(seed=0, epoch=1, position=512, fingerprint="ab12")["version"]
    1
    """
    seed, epoch = check_seed_epoch(seed, epoch)
    state = {
        "version": STATE_VERSION,
        "seed": seed,
        "epoch": epoch,
        "position": int(position),
        "fingerprint": str(fingerprint),
    }
    if processes is not None:
        state.update(partition="host", processes=int(processes))
    if mixture is not None:  # a mixture's recipe: a refused resume says what differs
        state["mixture"] = mixture
    if repeats != 1:
        state["repeats"] = int(repeats)
    if buckets is not None:
        state["buckets"] = buckets
    if packing is not None:
        state["packing"] = packing
    return state


def check_state(
    state,
    *,
    seed: int,
    fingerprint: str,
    n: int,
    processes: int | None = None,
    mixture: dict | None = None,
    repeats: int = 1,
    buckets: dict | None = None,
    packing: dict | None = None,
) -> tuple[int, int]:
    """Validates a state from `make_state` against this run; returns (epoch, position).

    `n` bounds the position (with parts: the largest part). `processes`: P for a
    partition="host" loader, None for the global order. A host-part state resumes at another
    process count only at an epoch boundary: mid-epoch the parts hold other records, so the
    rest of that epoch has no exact continuation, and this refuses it (the error says how to
    go on). Likewise a state of other `buckets` or `packing` (or of none, or to a loader without
    them) resumes only at an epoch boundary: its steps are other steps. Raises ValueError naming the
    offending value and what was expected.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; expected keys {list(_STATE_KEYS)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"state version {state['version']!r} is not supported: this tbljax reads version {STATE_VERSION}"
        )
    saved, mine = state.get("partition"), ("host" if processes is not None else None)
    if saved != mine:
        # Checked before the fingerprint: the two modes fingerprint the data differently.
        raise ValueError(
            f"state was saved by a loader with partition={saved!r} but this loader "
            f"has partition={mine!r}: its positions count other rows; create the "
            f"loader with partition={saved!r}"
        )
    if state["fingerprint"] != fingerprint:
        raise ValueError(
            f"state is for dataset {state['fingerprint']!r} but this loader reads "
            f"dataset {fingerprint!r}{_what_differs(state.get('mixture'), mixture)}"
        )
    if state["seed"] != seed:
        raise ValueError(
            f"state was saved with seed={state['seed']!r} but this loader has "
            f"seed={seed!r}: create the loader with the state's seed"
        )
    if state.get("repeats", 1) != repeats:
        raise ValueError(
            f"state was saved with repeats={state.get('repeats', 1)!r} but this loader has "
            f"repeats={repeats!r}: its positions count another epoch; create the loader with the state's repeats"
        )
    epoch, position = state["epoch"], state["position"]
    check_seed_epoch(seed, epoch)
    if not is_integer(position) or not 0 <= position <= n:
        raise ValueError(f"state position must be an integer in [0, {n}], got {position!r}")
    for name, mine in (("buckets", buckets), ("packing", packing)):
        if state.get(name) != mine and position != 0:
            raise ValueError(
                f"state was saved mid-epoch (epoch {epoch}, position {position}) with {name} "
                f"{state.get(name)!r} and this loader has {name} {mine!r}: its steps are "
                f"other steps, so the rest of epoch {epoch} has no exact continuation. Resume at an "
                f"epoch boundary: loader.set_epoch({epoch + 1}), or create the loader as the state's was"
            )
    if processes is not None:
        saved_p = state.get("processes")
        if not is_integer(saved_p) or saved_p < 1:
            raise ValueError(f"state 'processes' must be an integer >= 1, got {saved_p!r}")
        if saved_p != processes and position != 0:
            raise ValueError(
                f"state was saved mid-epoch (epoch {epoch}, position {position} of each "
                f"process's part) by {saved_p} processes, and this job has {processes}: with "
                f"partition='host' each process now owns other records, so the rest of epoch "
                f"{epoch} has no exact continuation. Resume at an epoch boundary: "
                f"loader.set_epoch({epoch + 1}) skips the rest of epoch {epoch}, "
                f"loader.set_epoch({epoch}) serves epoch {epoch} again from its start"
            )
    return int(epoch), int(position)


def _what_differs(saved, mine) -> str:
    """': their sources differ (state [...], this loader [...])', ... for two mixtures'
    descriptions; '' when either is not a mixture's."""
    if not (isinstance(saved, dict) and isinstance(mine, dict)):
        return ""
    diff = [f"{k} (state {saved.get(k)!r}, this loader {mine.get(k)!r})" for k in mine if saved.get(k) != mine.get(k)]
    return ": the mixtures differ in " + "; ".join(diff) if diff else ""
