"""`specchat models`: the packaged models, what the cache holds, clearing and verifying it; or
what a user's GGUF file holds and whether the fast path runs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from specchat.cli.exits import reports_errors
from specchat.errors import InvalidSettingError
from specchat.untrusted import visible


@click.command()
@click.argument("gguf_file", metavar="[FILE.gguf]", required=False, type=click.Path(path_type=Path))
@click.option(
    "--clear",
    "clear_name",
    metavar="NAME|all",
    help="Delete what the cache holds for NAME (every kind of file), or all of it; asks first.",
)
@click.option(
    "--verify",
    "verify_name",
    metavar="[NAME]",
    is_flag=False,
    flag_value="all",
    help="Hash every cached file against its record (seconds per GB); damaged ones are removed, "
    "so the next start rebuilds them.",
)
@click.option(
    "--kind", "kinds", multiple=True, metavar="KIND", help="With --clear or --verify: only this kind."
)
@click.option("--yes", "-y", is_flag=True, help="Clear without asking.")
@reports_errors
def models(
    gguf_file: Path | None, clear_name: str | None, verify_name: str | None, kinds: tuple[str, ...], yes: bool
) -> None:
    """List the packaged models and what the cache holds for each; clear or verify the cache.
    With FILE.gguf: what that file holds (architecture, types per tensor group, context length),
    whether the fast path runs it and why not, and its packed size. Only the header is read, and
    checked as a start checks it: a file a start would refuse is refused here (exit status 2).

    Exit status: 0 done; 1 nothing deleted (declined), something skipped (another specchat is
    using it) or something found damaged; 2 a bad name, kind or file.
    """
    from specchat.models import list_models
    from specchat.models.cache.paths import human_bytes

    if gguf_file is not None:
        if clear_name or verify_name or kinds:
            raise InvalidSettingError("FILE.gguf goes alone: `specchat models FILE.gguf` describes it.")
        _describe_file(gguf_file)
        return
    if kinds and not (clear_name or verify_name):
        raise InvalidSettingError("--kind goes with --clear or --verify (e.g. --clear all --kind converted).")
    if clear_name:
        sys.exit(_clear_cache(clear_name, kinds, yes))
    if verify_name:
        sys.exit(_verify_cache(verify_name, kinds))
    infos = list_models()
    width = max(20, *(len(visible(info.name)) + 1 for info in infos))
    click.echo(f"{'name':<{width}} {'kind':<9} {'role':<7} {'installed':<9} {'cached':<6} {'size':<8} about")
    for info in infos:
        size = human_bytes(info.size_bytes) if info.size_bytes else "–"
        # Names and origins of cached files come from file names: shown, never obeyed.
        click.echo(
            f"{visible(info.name):<{width}} {info.kind:<9} {info.role:<7} "
            f"{'yes' if info.installed else 'no':<9} {'yes' if info.cached else 'no':<6} {size:<8} "
            f"{visible(info.description)}"
        )
    click.echo()
    click.echo(_kernels_line())
    _print_cache_usage()


def _describe_file(path: Path) -> None:
    """Print what the GGUF at ``path`` holds; a path that is not a readable GGUF is one line."""
    from specchat.files import require_regular_file
    from specchat.models.gguf.report import describe_gguf, report_lines

    try:
        require_regular_file(path)
        report = describe_gguf(path)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise InvalidSettingError(f"cannot read {visible(str(path))}: {reason}") from None
    except ValueError as error:
        raise InvalidSettingError(str(error)) from None
    for line in report_lines(report):
        click.echo(line)
    if report.problem is None:
        from specchat.models.compute.first_start import estimate, estimate_lines

        for line in estimate_lines(estimate(report.size, report.packed_size)):
            click.echo(line)
    click.echo(_kernels_line())


def _kernels_line() -> str:
    """Which of specchat's CPU kernel variants a start on this machine runs, or why none can."""
    from specchat.kernels import ISA_ENV, cpu_supports, slow_reason, variant

    reason = cpu_supports()
    if reason is not None and os.environ.get(ISA_ENV):
        return f"CPU kernels: none ({reason}); a start refuses until {ISA_ENV} names one this CPU runs"
    if reason is not None:
        return f"CPU kernels: none ({reason}); a start on a CPU path says what to do instead"
    if slow_reason() is not None:
        return f"CPU kernels: scalar ({slow_reason()}; about 10× slower than a fast variant)"
    forced = f", forced by {ISA_ENV}" if os.environ.get(ISA_ENV) else ""
    return f"CPU kernels: {variant()}{forced} (the instruction set the packed models run on)"


def _print_cache_usage() -> None:
    from specchat.models.cache.paths import cache_dir, human_bytes
    from specchat.models.cache.usage import UNFINISHED, cache_items, usage

    root = cache_dir()
    items = cache_items()
    if root.exists() and not root.is_dir():
        click.echo(
            f"cache: {visible(str(root))} is a file, not a folder; move it away or set SPECCHAT_CACHE_DIR"
        )
        return
    if not items:
        click.echo(f"cache: {visible(str(root))} (empty)")
        return
    kinds, rows = usage(items)
    click.echo(f"cache: {visible(str(root))} ({human_bytes(sum(row.total for row in rows))})")
    width = max(len(visible(row.owner)) for row in [*rows]) + 2
    click.echo(f"{'model':<{width}}" + "".join(f"{visible(kind):<11}" for kind in kinds) + "total")
    for row in rows:
        cells = "".join(f"{human_bytes(row.by_kind[k]) if k in row.by_kind else '–':<11}" for k in kinds)
        click.echo(f"{visible(row.owner):<{width}}{cells}{human_bytes(row.total)}")
    if any(row.owner == UNFINISHED for row in rows):
        click.echo(f"{UNFINISHED}: left by an interrupted run (removed at the next start), or being written")
    click.echo("free space: specchat models --clear NAME|all [--kind KIND]")
    click.echo("check every byte: specchat models --verify [NAME]")


def _chosen_items(name: str, kinds: tuple[str, ...]) -> list[Any]:
    """The cache items NAME (or all) and --kind mean; a name or kind that matches nothing is a user
    error, except a packaged model with nothing cached yet."""
    from specchat.models import PACKAGED
    from specchat.models.cache.usage import UNFINISHED, cache_items, select, usage

    items = cache_items()
    owners = [row.owner for row in usage(items)[1] if row.owner != UNFINISHED]
    present = sorted({item.kind for item in items})
    unknown = [kind for kind in kinds if kind not in present]
    if unknown:
        raise InvalidSettingError(
            f"no {unknown[0]!r} in the cache; kinds present: {', '.join(present) or 'none (it is empty)'}"
        )
    if name != "all" and name not in owners and name != UNFINISHED and name not in PACKAGED:
        raise InvalidSettingError(
            f"nothing cached under {name!r}; cached: {', '.join(owners) or 'nothing'} (or `all`)"
        )
    return select(items, name, kinds)


def _clear_cache(name: str, kinds: tuple[str, ...], yes: bool) -> int:
    from specchat.models.cache.paths import human_bytes
    from specchat.models.cache.usage import clear

    chosen = _chosen_items(name, kinds)
    if not chosen:
        click.echo(f"nothing cached for {name}" if name != "all" else "the cache is empty; nothing to clear")
        return 0
    total = sum(item.size for item in chosen)
    for item in chosen:
        click.echo(
            f"  {visible(item.owner)} ({visible(item.kind)}): {visible(str(item.path))} · "
            f"{human_bytes(item.size)}"
        )
    if not yes:
        try:
            question = f"Delete {human_bytes(total)} from the model cache?"
            agreed = click.confirm(question, default=False, err=True)
        except click.Abort:
            click.echo("\nspecchat: nothing deleted (pass --yes to clear without asking).", err=True)
            return 1
        if not agreed:
            click.echo("specchat: nothing deleted.", err=True)
            return 1
    report = clear(chosen)
    click.echo(f"freed {human_bytes(report.freed)}")
    for item, why in report.skipped:
        click.echo(
            f"specchat: skipped {visible(item.owner)} ({visible(item.kind)}): {visible(why)}; close it, "
            "or clear again when it is done",
            err=True,
        )
    return 1 if report.skipped else 0


def _verify_cache(name: str, kinds: tuple[str, ...]) -> int:
    from specchat.models.cache.usage import LAYOUT_ONLY, NOT_CHECKED, clear, verifiable, verify
    from specchat.models.cache.writes import EntryBusy, entry_lock

    damaged = 0
    for item in verifiable(_chosen_items(name, kinds)):
        click.echo(
            f"{visible(item.owner)} ({visible(item.kind)}): ", nl=False
        )  # the verdict follows once hashed
        try:
            with entry_lock(item.guard, "verifying the cache", wait=False):
                problem = verify(item)
        except EntryBusy as busy:
            click.echo(f"not checked, {busy.holder}")
            continue
        if problem is None:
            click.echo("ok")
        elif problem in (NOT_CHECKED, LAYOUT_ONLY):
            click.echo(problem)
        else:
            damaged += 1
            removed = not clear([item]).skipped
            outcome = "removed, the next start rebuilds it" if removed else "could not remove it"
            click.echo(f"damaged ({visible(problem)}); {outcome}")
    return 1 if damaged else 0
