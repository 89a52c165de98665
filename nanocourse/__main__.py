"""Command line: `python -m nanocourse serve` serves your engine, `my_llm()`, over the OpenAI API: the server of
`python -m nanoengine serve`, handed the LLM your finished parts build and the course's pictures for its /live page
(nanocourse/engine_view.py)."""

from __future__ import annotations

import argparse
import sys

from nanoengine.__main__ import add_serve_arguments, serve_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocourse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve my_llm() over HTTP with the OpenAI API (/v1/completions, ...)")
    serve.add_argument(
        "--source",
        default="exercises",
        choices=["exercises", "solutions"],
        help="whose parts: yours, or the worked ones",
    )
    add_serve_arguments(serve)
    args = parser.parse_args(argv)
    from nanocourse.engine_view import engine_state_html
    from nanocourse.my_engine import my_llm

    return serve_cli(lambda: my_llm(source=args.source), args, live_view=engine_state_html)


if __name__ == "__main__":
    sys.exit(main())
