"""llama.cpp as a peer: its own server decoding the same GGUF files, prompts and token budget.

Why ``llama-server``: its ``/completion`` endpoint takes the prompt as token ids, so llama.cpp
decodes exactly the tokens specchat's chat template produced, with the same budget; it answers
with the generated token ids (compared with specchat's replies) and with timings its own clock
measured inside the server (prompt processing and generation apart, plus its draft statistics).
``llama-bench`` times synthetic prompts and ``llama-speculative-simple`` takes text, so neither
could be given the same prompt token for token.

Two servers run for the whole bench, one per row: the target alone ("llama.cpp plain") and the
target with the draft model ("llama.cpp speculative", ``--spec-type draft-simple``). Greedy
sampling, one slot, a fresh prompt for every request (``cache_prompt`` off), the same threads
as the torch runs. Between requests a server waits idle, so the two never compete with the run
being timed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specchat.bench import BenchError

SERVER = "llama-server"
BUILD_ENV = "SPECCHAT_LLAMA_CPP"
DEFAULT_BUILD = Path("~/.cache/specchat-peers/llamacpp/bin")
PLAIN_ROW = "llama.cpp plain"
SPECULATIVE_ROW = "llama.cpp speculative"


def default_build() -> Path | None:
    """The build folder from $SPECCHAT_LLAMA_CPP, else the default one, if it holds a server."""
    folder = Path(os.environ.get(BUILD_ENV) or DEFAULT_BUILD).expanduser()
    return folder if (folder / SERVER).is_file() else None


def find_server(folder: Path) -> Path:
    """``llama-server`` inside a build folder (its ``bin``), or a BenchError saying what to pass."""
    folder = folder.expanduser()
    for candidate in (folder / SERVER, folder / "bin" / SERVER, folder / "build" / "bin" / SERVER):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BenchError(
        f"no {SERVER} in {folder}: pass the folder holding llama.cpp's binaries "
        "(see docs/performance.md, 'llama.cpp as a peer')."
    )


def gguf_for(spec: str) -> Path:
    """The GGUF file llama.cpp should load for a model the bench was given (the very file specchat
    converted its weights from): a packaged model's verified, assembled GGUF, or a .gguf path."""
    from specchat.models.names.assemble import packaged_gguf
    from specchat.models.names.resolve import resolve_spec

    resolved = resolve_spec(spec)
    if resolved.kind == "packaged" and resolved.packaged is not None:
        return packaged_gguf(resolved.packaged)
    if resolved.kind == "gguf":
        return Path(resolved.location)
    raise BenchError(
        f"--llama-cpp needs GGUF models, and {spec} is a {resolved.kind} model: "
        "use a packaged model or a .gguf file."
    )


# ------------------------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class PeerTimings:
    """What llama.cpp measured itself, as its ``timings`` object reports it."""

    prompt_n: int
    prompt_ms: float
    """Prompt processing, up to and including sampling the first token (it comes from the
    prompt's logits: llama.cpp counts it as free)."""
    predicted_n: int
    """Tokens generated, the first one included."""
    predicted_ms: float
    """From the first token to the last: the ``predicted_n − 1`` decoding steps."""
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @property
    def decode_steps(self) -> int:
        return max(self.predicted_n - 1, 0)

    def to_json(self) -> dict[str, object]:
        return {
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
        }


@dataclass(frozen=True)
class PeerCompletion:
    token_ids: list[int]
    """The reply's token ids, the stop token left out (as specchat leaves it out)."""
    text: str
    stop: str
    """"eos" or "max_tokens" (specchat's names for llama.cpp's stop types)."""
    timings: PeerTimings | None


def parse_completion(data: dict[str, Any], stop_ids: frozenset[int] = frozenset()) -> PeerCompletion:
    """A ``/completion`` response (non-streamed, ``return_tokens`` on) as a PeerCompletion.

    Raises BenchError on a response of another shape (an error object, a different build).
    """
    if "error" in data:
        error = data["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise BenchError(f"llama.cpp refused the request: {message}")
    try:
        tokens = [int(t) for t in data["tokens"]]
        stop_type = str(data.get("stop_type", ""))
        text = str(data["content"])
    except (KeyError, TypeError, ValueError) as err:
        raise BenchError(f"unexpected reply from {SERVER} (missing {err}): is it a llama.cpp build?") from err
    while tokens and tokens[-1] in stop_ids:
        tokens.pop()
    raw = data.get("timings")
    return PeerCompletion(tokens, text, "eos" if stop_type == "eos" else "max_tokens", parse_timings(raw))


def parse_timings(raw: object) -> PeerTimings | None:
    if not isinstance(raw, dict):
        return None
    try:
        return PeerTimings(
            prompt_n=int(raw["prompt_n"]),
            prompt_ms=float(raw["prompt_ms"]),
            predicted_n=int(raw["predicted_n"]),
            predicted_ms=float(raw["predicted_ms"]),
            draft_n=int(raw["draft_n"]) if "draft_n" in raw else None,
            draft_n_accepted=int(raw["draft_n_accepted"]) if "draft_n_accepted" in raw else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_version(text: str) -> str:
    """``llama-server --version`` output → its first line (e.g. "version: 0.6.0-dev (build 0, …)")."""
    for line in text.splitlines():
        if line.startswith("version:"):
            return line.removeprefix("version:").strip()
    return "unknown"


# ------------------------------------------------------------------------------------ servers
def completion_request(prompt_ids: Sequence[int], max_new_tokens: int, n_probs: int = 0) -> dict[str, object]:
    """Greedy, exactly ``max_new_tokens`` at most, the prompt as token ids, nothing cached;
    ``n_probs`` > 0 also asks for the log-probabilities of that many best candidates per token."""
    request: dict[str, object] = {
        "prompt": list(prompt_ids),
        "n_predict": max_new_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
    }
    if n_probs > 0:
        request["n_probs"] = n_probs
    return request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """One ``llama-server`` process, started on a free local port, stopped on ``close``."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        draft: Path | None = None,
        draft_max: int = 4,
        threads: int,
        context: int,
        log: Path,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.log = log
        args = [
            str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", str(context),
            "-np", "1", "--host", "127.0.0.1", "--port", str(self.port), "--no-webui",
            "-cram", "0",  # no prompt cache in RAM either: every request processes its prompt
        ]  # fmt: skip
        if draft is not None:
            args += [
                "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max),
                "-td", str(threads), "-tbd", str(threads),
            ]  # fmt: skip
        self.args = args
        with log.open("wb") as sink:
            self.process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=_env(binary))
        self._wait_ready(start_timeout_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"{SERVER} exited while starting: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.close()
        raise BenchError(f"{SERVER} did not become ready within {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(tail) + f" (log: {self.log})"

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, n_probs: int = 0) -> dict[str, Any]:
        """The raw ``/completion`` response."""
        body = json.dumps(completion_request(prompt_ids, max_new_tokens, n_probs)).encode()
        request = urllib.request.Request(
            f"{self.url}/completion", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=3600) as reply:
                return json.loads(reply.read())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as err:
            try:
                return json.loads(err.read())  # type: ignore[no-any-return]
            except ValueError:
                raise BenchError(f"{SERVER} answered HTTP {err.code}: {self.log_tail()}") from err
        except (urllib.error.URLError, OSError) as err:
            raise BenchError(f"{SERVER} stopped answering ({err}): {self.log_tail()}") from err

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class LlamaCppPeer:
    """Both rows' servers, and how to reach them from the bench's runner."""

    version: str
    servers: dict[str, LlamaServer]
    """Row name → its server."""
    target_gguf: Path
    draft_gguf: Path | None
    stop_ids: frozenset[int]

    def run(self, row: str, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[PeerCompletion, float]:
        """One reply and the wall time around the request, as the bench sees it."""
        server = self.servers[row]
        start = time.perf_counter()
        data = server.complete(prompt_ids, max_new_tokens)
        wall = time.perf_counter() - start
        return parse_completion(data, self.stop_ids), wall

    def close(self) -> None:
        for server in self.servers.values():
            server.close()

    def meta(self) -> dict[str, object]:
        return {
            "version": self.version,
            "target_gguf": str(self.target_gguf),
            "draft_gguf": str(self.draft_gguf) if self.draft_gguf else None,
            "servers": {row: server.args for row, server in self.servers.items()},
        }


def _env(binary: Path) -> dict[str, str]:
    """The environment with the build's own folder first on the library path: a build folder
    copied elsewhere keeps its shared libraries next to the binaries."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(binary.parent), env.get("LD_LIBRARY_PATH")]))
    return env


def server_version(binary: Path) -> str:
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(binary),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BenchError(f"cannot run {binary}: {err}") from err
    if done.returncode != 0:
        raise BenchError(f"{binary} --version failed: {(done.stderr or done.stdout).strip()[:200]}")
    return parse_version(done.stdout + done.stderr)


def start_peer(
    folder: Path,
    target_gguf: Path,
    draft_gguf: Path | None,
    *,
    threads: int,
    context: int,
    draft_max: int,
    stop_ids: frozenset[int],
    log_dir: Path,
) -> LlamaCppPeer:
    """Start the plain server and, with a draft, the speculative one."""
    binary = find_server(folder)
    version = server_version(binary)
    servers: dict[str, LlamaServer] = {}
    try:
        servers[PLAIN_ROW] = LlamaServer(
            binary, target_gguf, threads=threads, context=context, log=log_dir / "llama-server-plain.log"
        )
        if draft_gguf is not None:
            servers[SPECULATIVE_ROW] = LlamaServer(
                binary,
                target_gguf,
                draft=draft_gguf,
                draft_max=draft_max,
                threads=threads,
                context=context,
                log=log_dir / "llama-server-speculative.log",
            )
    except BaseException:
        for server in servers.values():
            server.close()
        raise
    return LlamaCppPeer(version, servers, target_gguf, draft_gguf, stop_ids)
