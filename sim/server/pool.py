"""aiohttp server of ONE simulated inference pool, and its CLI.

    python -m sim.server.pool --name default --port 18001 [--host 127.0.0.1] [--time-scale 1.0]
                              [--seed 0] [--kv-capacity-tokens N] [--max-num-seqs N] [--max-queue N]
                              [--model NAME] [--base-latency-ms MS]
                              [--kv-block-size 16 --tokenizer deepseek
                               [--kv-events-port P [--kv-events-replay-port R]]]

Prints `sim pool <name> listening on http://<host>:<port>` once bound (`--port 0` picks a free
port and prints it) and exits 0 on SIGTERM/SIGINT.

Endpoints, as vLLM 0.32 serves them: POST /v1/chat/completions, /v1/completions,
/v1/responses (OpenAI Responses API), /v1/messages (Anthropic Messages API), /v1/embeddings
and /invocations (JSON or SSE, each API's own shapes); the cheap POST /tokenize, /detokenize,
/v1/messages/count_tokens; GET /v1/models, /health, /metrics (vLLM names); and some of
vLLM's operational endpoints (/scale_elastic_ep, /reset_prefix_cache, /sleep, /version,
/v1/chat/completions/batch, /pooling), which answer 200 so that a test can tell whether a
gateway forwarded them. GET|POST|DELETE /fault injects faults. Every response carries
`x-sim-pool: <name>`; inference responses also echo what the upstream received
(`x-sim-saw-headers`, `x-sim-stream-options`, `x-sim-model`, `x-sim-max-tokens`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from sim.server._openai import Endpoint, RequestError, invocation_endpoint
from sim.server._serving import SimPool, error_response
from sim.server.config import PoolConfig
from sim.server.faults import parse_fault_request
from sim.server.kv_publisher import KvEventPublisher

__all__ = ["POOL_KEY", "PoolConfig", "SimPool", "create_app", "main", "serve_pool"]

POOL_KEY = web.AppKey("sim_pool", SimPool)
OPERATIONAL_PATHS = (
    "/scale_elastic_ep",
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
    "/version",
    "/v1/chat/completions/batch",
    "/pooling",
    "/generative_scoring",
)
_log = logging.getLogger("sim.server.pool")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error"}


@web.middleware
async def _openai_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Router errors (404, 405) and crashes come back as OpenAI-style JSON, never HTML/text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = _ERROR_TYPES.get(exc.status, "server_error")
        return error_response(exc.status, exc.reason, error_type, str(exc.status))
    except Exception:
        _log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(500, "internal error in the simulator", "server_error", "internal")


def create_app(config: PoolConfig) -> web.Application:
    pool = SimPool(config)
    app = web.Application(middlewares=[_openai_errors])
    app[POOL_KEY] = pool

    async def add_pool_header(_: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-sim-pool"] = config.name

    def inference(endpoint: Endpoint) -> _Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await pool.serve(request, endpoint)

        return handler

    async def invocations(request: web.Request) -> web.StreamResponse:
        try:
            endpoint = invocation_endpoint(await request.read())
        except RequestError as exc:
            return error_response(400, exc.message, "invalid_request_error", exc.code)
        return await pool.serve(request, endpoint)

    async def tokenize(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return error_response(400, "invalid JSON", "invalid_request_error", "invalid_json")
        text = json.dumps(body.get("prompt") or body.get("messages") or "")
        count = pool.count_tokens(text)
        return web.json_response({"count": count, "max_model_len": config.max_model_len_tokens})

    async def detokenize(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"prompt": ""})

    async def count_tokens(request: web.Request) -> web.Response:
        raw = await request.read()
        return web.json_response(
            {"input_tokens": pool.count_tokens(raw.decode("utf-8", "replace"))}
        )

    async def operational(request: web.Request) -> web.Response:
        # vLLM's operator endpoints: a gateway must never forward these unless told to.
        await request.read()
        return web.json_response({"operational": request.path})

    async def models(_: web.Request) -> web.Response:
        entry = {
            "id": config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "slogate-sim",
            "max_model_len": config.max_model_len_tokens,
        }
        return web.json_response({"object": "list", "data": [entry]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(_: web.Request) -> web.Response:
        body = pool.metrics.render(pool.kv)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_fault(_: web.Request) -> web.Response:
        return web.json_response(pool.faults.describe())

    async def set_fault(request: web.Request) -> web.Response:
        try:
            faults, duration_s = parse_fault_request(json.loads(await request.read()))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError too
            return error_response(400, str(exc), "invalid_request_error", "invalid_fault")
        pool.faults.set(faults, duration_s)
        return web.json_response(pool.faults.describe())

    async def clear_fault(_: web.Request) -> web.Response:
        pool.faults.clear()
        return web.json_response(pool.faults.describe())

    app.on_response_prepare.append(add_pool_header)
    app.router.add_post("/v1/chat/completions", inference(Endpoint.CHAT))
    app.router.add_post("/v1/completions", inference(Endpoint.COMPLETIONS))
    app.router.add_post("/v1/responses", inference(Endpoint.RESPONSES))
    app.router.add_post("/v1/messages", inference(Endpoint.MESSAGES))
    app.router.add_post("/v1/embeddings", inference(Endpoint.EMBEDDINGS))
    app.router.add_post("/invocations", invocations)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    for path in OPERATIONAL_PATHS:
        app.router.add_route("*", path, operational)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/fault", get_fault)
    app.router.add_post("/fault", set_fault)
    app.router.add_delete("/fault", clear_fault)
    return app


async def start_kv_events(pool: SimPool, host: str) -> KvEventPublisher | None:
    """The pool's KV event publisher, bound and serving replays, where its config asks."""
    config = pool.config
    if config.kv_events_port is None:
        return None
    publisher = KvEventPublisher(host, config.kv_events_port, config.kv_events_replay_port)
    publisher.start()
    pool.kv_events = publisher
    return publisher


async def serve_pool(config: PoolConfig, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; announces the bound address on stdout."""
    # Handler cancellation: a client that hangs up leaves the queue / frees its KV, as in vLLM.
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, handler_cancellation=True)
    await runner.setup()
    publisher = await start_kv_events(app[POOL_KEY], host)
    try:
        await web.TCPSite(runner, host, port).start()
        bound_port = runner.addresses[0][1]
        shown_host = f"[{host}]" if ":" in host else host
        print(f"sim pool {config.name} listening on http://{shown_host}:{bound_port}", flush=True)
        if publisher is not None:
            print(
                f"sim pool {config.name} publishes KV events on tcp://{shown_host}:"
                f"{publisher.port} (replay {publisher.replay_port})",
                flush=True,
            )
        await stop.wait()
    finally:
        await runner.cleanup()
        if publisher is not None:
            await publisher.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = PoolConfig()
    parser = argparse.ArgumentParser(
        prog="python -m sim.server.pool", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--name", default=defaults.name)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18001)
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        help="names the pool answers to (repeat); others get vLLM's 404. Default: any",
    )
    parser.add_argument("--time-scale", type=float, default=defaults.time_scale)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--kv-capacity-tokens", type=int, default=defaults.kv_capacity_tokens)
    parser.add_argument("--max-queue", type=int, default=defaults.max_queue)
    parser.add_argument(
        "--max-num-seqs", type=int, default=defaults.max_running_requests, help="batch slots"
    )
    parser.add_argument("--base-latency-ms", type=float, default=defaults.base_latency_ms)
    parser.add_argument("--tokenizer", choices=("approx", "deepseek"), default=defaults.tokenizer)
    parser.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"), default=defaults.scheduling_policy
    )
    parser.add_argument(
        "--kv-block-size",
        type=int,
        default=None,
        help="vLLM's prefix caching in the KV cache, in blocks of this many tokens "
        "(needs --tokenizer deepseek)",
    )
    parser.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        help="publish the KV events on ZMQ (PUB) on this port, as vLLM's --kv-events-config",
    )
    parser.add_argument(
        "--kv-events-replay-port", type=int, default=None, help="the events' ROUTER replay port"
    )
    return parser.parse_args(argv)


async def _run_until_signalled(config: PoolConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve_pool(config, host, port, stop)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        config = PoolConfig(
            name=args.name,
            model=args.model,
            time_scale=args.time_scale,
            seed=args.seed,
            kv_capacity_tokens=args.kv_capacity_tokens,
            max_running_requests=args.max_num_seqs,
            max_queue=args.max_queue,
            base_latency_ms=args.base_latency_ms,
            tokenizer=args.tokenizer,
            scheduling_policy=args.scheduling_policy,
            served_models=tuple(args.served_model_name),
            kv_block_size=args.kv_block_size,
            kv_events_port=args.kv_events_port,
            kv_events_replay_port=args.kv_events_replay_port,
        )
    except ValueError as exc:
        print(f"sim pool: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_run_until_signalled(config, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
