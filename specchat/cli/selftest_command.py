"""`specchat selftest`: does speculative decoding sample exactly what the target samples, here?"""

from __future__ import annotations

import sys
import threading
from typing import Any

import click

from specchat.cli.exits import UNEXPECTED, reports_errors, stop_on_signals, write_output
from specchat.cli.load_progress import open_for_talk_job
from specchat.cli.options import debug_option, model_options, settings_from
from specchat.cli.prompt_input import check_prompt_argument
from specchat.errors import InvalidSettingError
from specchat.presenters.verdict import greedy_verdict
from specchat.untrusted import json_text

SELFTEST_TEMPERATURE = 1.0
"""The sampling self-test's temperature unless --temperature is given (0 checks greedy equality)."""
SELFTEST_GREEDY_TOKENS = 48


@click.command()
@model_options
@click.option(
    "--samples",
    type=click.IntRange(1),
    default=2000,
    show_default=True,
    help="Samples per lane (at T > 0); tiny models manage 100000.",
)
@click.option(
    "--tokens",
    type=click.IntRange(1, 4),
    default=2,
    show_default=True,
    help="Reply tokens per sample: each distinct sequence is one outcome.",
)
@click.option("--prompt", "selftest_prompt", metavar="TEXT", help="The fixed prompt sampled (at T > 0).")
@click.option("--json", "json_path", metavar="FILE", help="Save the result as JSON.")
@debug_option
@reports_errors
def selftest(
    samples: int, tokens: int, selftest_prompt: str | None, json_path: str | None, **options: Any
) -> None:
    """Check on this machine that speculative decoding samples exactly what the target samples.

    At T > 0 (T = 1 unless --temperature is given) it samples the first tokens of a reply to a
    fixed prompt again and again, by speculative decoding (the current drafter and γ) and by the
    target alone, and compares the two histograms: total variation distance against its
    sampling-noise band, and a chi-square test. At --temperature 0 it checks token-for-token
    equality on a few prompts instead. Exit status 1 when the check finds a difference.
    """
    from specchat.engine.selftest import SELFTEST_PROMPT

    if options.get("temperature") is None:
        options["temperature"] = SELFTEST_TEMPERATURE
    greedy = options["temperature"] == 0
    if greedy and options.get("max_new_tokens") is None:
        options["max_new_tokens"] = SELFTEST_GREEDY_TOKENS
    prompt = check_prompt_argument(selftest_prompt) if selftest_prompt is not None else SELFTEST_PROMPT
    if not prompt.strip():
        raise InvalidSettingError("the prompt is empty: pass some text with --prompt, or leave it out.")
    settings = settings_from(options)
    engine, controls = open_for_talk_job(
        settings,
        server_refusal="the self-test needs local models: a server returns no token ids to count.",
        none_refusal="--drafter none drafts nothing: there would be nothing to test.",
    )
    cancel = threading.Event()
    report_gpu_rows(engine)
    with stop_on_signals(cancel) as signals:
        if greedy:
            ok, data = run_greedy_selftest(engine, controls, settings.system_prompt, cancel)
        else:
            ok, data = run_sampling_selftest(
                engine, controls, prompt, settings.system_prompt, samples, tokens, cancel
            )
    if json_path is not None:
        write_output(json_path, json_text(data, indent=1) + "\n")
        click.echo(f"specchat: self-test saved to {json_path}", err=True)
    if cancel.is_set():
        sys.exit(signals.exit_status)
    if not ok:
        sys.exit(UNEXPECTED)


def report_gpu_rows(engine: Any) -> None:
    """On CUDA, say how this GPU's verify rows compare with one-token rows (docs/performance.md, GPUs):
    exactness there is measured, not promised, unless exact mode's kernels run."""
    target = getattr(engine, "target", None)
    if target is None or target.device.type != "cuda":
        return
    import torch

    from specchat.engine.exact import row_agreement

    ids = engine.prompt_ids([{"role": "user", "content": "Explain in two sentences what a hash table is."}])
    agreement = row_agreement(target, (ids * 2)[: max(len(ids), 16)])
    target.reset()
    click.echo(agreement.line(torch.cuda.get_device_name(target.device)))


def run_greedy_selftest(
    engine: Any, controls: Any, system_prompt: str | None, cancel: threading.Event
) -> tuple[bool, dict[str, Any]]:
    from specchat.engine.selftest import greedy_equality

    checks = []
    for check in greedy_equality(engine, controls, system_prompt=system_prompt, cancel=cancel):
        checks.append(check)
        verdict = greedy_verdict(check.identical, check.first_difference)
        alpha = "–" if check.alpha is None else f"{check.alpha:.2f}"
        click.echo(f"{verdict:<12} {len(check.plain_ids):>4} tokens · α {alpha} · {check.prompt}")
    ok = all(check.identical for check in checks)
    what = "token for token identical" if ok else "NOT identical: speculative decoding changed the text"
    click.echo(
        f"selftest (T = 0, γ {controls.gamma}, drafter {controls.drafter}): {len(checks)} prompts {what}"
    )
    return ok, {"type": "selftest", "temperature": 0.0, "checks": [c.to_json() for c in checks]}


def run_sampling_selftest(
    engine: Any,
    controls: Any,
    prompt: str,
    system_prompt: str | None,
    samples: int,
    tokens: int,
    cancel: threading.Event,
) -> tuple[bool, dict[str, Any]]:
    from specchat.engine.selftest import ExactnessSampler, selftest_messages
    from specchat.presenters.selftest_text import progress_line, report_lines

    sampler = ExactnessSampler(
        engine, selftest_messages(prompt, system_prompt), controls, tokens=tokens, seed=controls.seed or 0
    )
    tty = sys.stderr.isatty()

    def show(report: Any) -> None:
        if tty:
            click.echo(f"\r{progress_line(report, samples)}\x1b[K", err=True, nl=False)

    report = sampler.run(samples, cancel=cancel, on_report=show, report_every=0.5 if tty else 1e9)
    if tty:
        click.echo("", err=True)
    for line in report_lines(report):
        click.echo(line)
    return report.consistent, report.to_json()
