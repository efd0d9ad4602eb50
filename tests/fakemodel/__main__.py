"""``python -m tests.fakemodel --port N --scenario S``: run the fake model server in the
foreground, printing its URL, then one JSON line per request (to stdout, or ``--log FILE``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.fakemodel.scenarios import DEFAULT_SLOW_DELAY_S, SCENARIOS
from tests.fakemodel.server import FakeModelServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakemodel", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--scenario", choices=SCENARIOS, default="text")
    parser.add_argument(
        "--answer-model",
        default=None,
        help="model the responses claim answered (default: the requested one)",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=DEFAULT_SLOW_DELAY_S,
        help="seconds between SSE frames in the slow scenario",
    )
    parser.add_argument("--log", default=None, help="append the request log to this file")
    args = parser.parse_args(argv)

    fake = FakeModelServer(
        args.scenario, port=args.port, answer_model=args.answer_model, slow_delay=args.delay
    )
    out = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout  # noqa: SIM115
    with fake:
        print(fake.url, flush=True)
        seen = 0
        try:
            while True:
                time.sleep(0.2)
                requests = fake.requests
                for request in requests[seen:]:
                    out.write(json.dumps(request.as_dict(), ensure_ascii=False) + "\n")
                    out.flush()
                seen = len(requests)
        except KeyboardInterrupt:
            pass
        finally:
            if out is not sys.stdout:
                out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
