"""Command line: `python -m nanoengine generate --prompt ...`, `chat "..."` and `serve` (the OpenAI-compatible
server, entrypoints/openai/api_server.py). (The benchmark is `python bench/engine.py`: it is not part of the
engine.)"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from nanoengine.errors import NanoEngineError

if TYPE_CHECKING:
    from nanoengine.entrypoints.llm import LLM
    from nanoengine.entrypoints.openai.live import LiveView


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="path to a llama .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    _add_model(p)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _leave_on_ctrl_c(signum: int, frame: object) -> None:
    """Ctrl-C during generate or chat: one line and the shell's status for SIGINT (130), at once. These commands own
    nothing that outlives the process, and a KeyboardInterrupt raised wherever the signal lands can go wrong: inside
    torch (loading the weights, a step) it may come out as another exception, and it may leave the engine's execute
    thread for the interpreter's shutdown to wait on. So the process leaves without unwinding (and writes its line
    unbuffered: the signal may land inside a print to stderr)."""
    os.write(sys.stderr.fileno(), b"interrupted\n")
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanoengine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete a raw text prompt")
    gen.add_argument("--prompt", required=True)
    _add_sampling(gen)
    chat = sub.add_parser("chat", help="answer one user message with the model's chat template")
    chat.add_argument("message")
    _add_sampling(chat)
    serve = sub.add_parser("serve", help="serve the model over HTTP with the OpenAI API (/v1/completions, ...)")
    _add_model(serve)
    add_serve_arguments(serve)
    args = parser.parse_args(argv)
    if args.command == "serve":
        from nanoengine.entrypoints.llm import LLM

        return serve_cli(lambda: LLM(args.model, device=args.device), args)

    previous = signal.signal(signal.SIGINT, _leave_on_ctrl_c)
    try:
        from nanoengine.entrypoints.llm import LLM
        from nanoengine.sampling_params import SamplingParams

        params = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
        )
        llm = LLM(args.model, device=args.device)
        prompt = (
            args.prompt
            if args.command == "generate"
            else llm.tokenizer.apply_chat_template([{"role": "user", "content": args.message}])
        )
        out = llm.generate(prompt, params)[0]
    except NanoEngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, previous)
    print(out.text)
    print(
        f"\n[{len(out.prompt_token_ids)} prompt tokens, {len(out.token_ids)} generated ({out.finish_reason}) | "
        f"TTFT {out.ttft * 1000:.0f} ms | decode {out.decode_tokens_per_s:.1f} tokens/s | {llm.device}]",
        file=sys.stderr,
    )
    return 0


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The server's own options, vLLM's names (`vllm serve --host --port --api-key --served-model-name`)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="if given, /v1 routes want `Authorization: Bearer <key>`")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the GGUF's)")
    p.epilog = (
        "Open http://HOST:PORT/live in a browser to watch the engine's state while clients stream: the block pool, "
        "the free queue, the running and waiting requests, the prefix-cache hit rate and the last steps' plans. "
        "GET /engine_state returns it as JSON. Neither wants the API key, as /metrics does not."
    )


def serve_cli(build_llm: Callable[[], LLM], args: argparse.Namespace, live_view: LiveView | None = None) -> int:
    """Build the LLM and serve it until Ctrl-C; an engine error is one line on stderr and status 2. live_view draws
    the /live page's pictures (None: the engine's plain view)."""
    try:
        from nanoengine.entrypoints.openai.api_server import run_server

        run_server(
            build_llm(),
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            served_model_name=args.served_model_name,
            live_view=live_view,
        )
    except NanoEngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
