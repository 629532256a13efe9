"""Run the shop web site: `python -m agentgym_opsd.environments.webshop.serve [--port 3000]`.

Open http://127.0.0.1:3000/new in a browser to shop for a random training goal. Bad arguments (a port
outside 0..65535, a non-positive TTL or count, a --data-dir without the WebShop files) are usage errors. It
runs on the serving kit's HTTP host (`agentgym_opsd.serving.host`, uvicorn; limits `server.LIMITS`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentgym_opsd.environments.webshop.loaders import OPTIONAL_FILES, RealDataError, missing_real_files
from agentgym_opsd.environments.webshop.server import LIMITS, create_app
from agentgym_opsd.environments.webshop.shop import DEFAULT_NUM_PRODUCTS, load_shop
from agentgym_opsd.serving import (
    add_limit_arguments,
    limits_from_args,
    port_number,
    positive_float,
    positive_int,
    serve,
    wsgi_host,
)

__all__ = ["main"]


def _check_data_dir(parser: argparse.ArgumentParser, data_dir: str | None) -> None:
    if data_dir is None:
        return
    if not Path(data_dir).is_dir():
        parser.error(f"--data-dir {data_dir}: no such folder")
    missing = missing_real_files(Path(data_dir))
    if missing:
        parser.error(f"--data-dir {data_dir} does not hold the WebShop data files: missing {', '.join(missing)} "
                     f"({', '.join(OPTIONAL_FILES)} is optional)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the WebShop site on 127.0.0.1.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1, local only)")
    parser.add_argument("--port", type=port_number, default=3000, help="TCP port (0 picks a free one)")
    parser.add_argument("--num-products", type=positive_int, default=DEFAULT_NUM_PRODUCTS,
                        help="generated catalogue size")
    parser.add_argument("--seed", type=int, default=0, help="catalogue seed")
    parser.add_argument("--data-dir", default=None, help="folder with the real WebShop files instead")
    parser.add_argument("--session-ttl", type=positive_float, default=900.0,
                        help="seconds before an idle session is freed")
    parser.add_argument("--max-sessions", type=positive_int, default=512, help="live sessions at most")
    parser.add_argument("--max-sessions-per-client", type=positive_int, default=64,
                        help="live sessions one client address may hold")
    add_limit_arguments(parser, LIMITS)
    args = parser.parse_args(argv)
    _check_data_dir(parser, args.data_dir)
    try:  # also covers $AGENTGYM_OPSD_WEBSHOP_DATA, read when --data-dir is absent
        shop = load_shop(args.num_products, args.seed, args.data_dir)
    except RealDataError as exc:
        parser.error(str(exc))
    app = create_app(shop, session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                     max_sessions_per_client=args.max_sessions_per_client)
    serve(wsgi_host(app, limits_from_args(args, LIMITS)), args.host, args.port,
          lambda url: f"WebShop serving {len(shop.products)} products on {url}/")


if __name__ == "__main__":
    main()
