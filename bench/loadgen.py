"""The admission load generator, a process of its own: `python -m bench.loadgen POINT.json`.

POINT.json: {"url", "ca", "bodies" (a JSON file: list of request bodies), "mode": "closed" |
"open", "concurrency" (closed) or "rate" (open), "warmup", "seconds", and "keep_latencies" (true: the
result lists every measured latency, `latencies_ms`)}. Prints one JSON result.

One aiohttp ClientSession with keep-alive, verifying the server's certificate against `ca`.
- closed loop: `concurrency` workers, each sends its next request when the previous answer came;
  latency is send to answer; throughput is answers per second (the server's capacity).
- open loop: requests are due at a fixed `rate` whatever the answers do (each is its own task, so
  a slow answer never delays the next send); latency is send to answer, and `send_lag` says how
  late the generator sent against the schedule (asyncio timers wake up to ~1 ms late; a larger lag
  means the generator, not the server, fell behind). A server that cannot keep up shows in the
  achieved rate and in the latency of the requests queued on its connections.
Only requests started after the warmup count. The first answers of each kind are checked
(HTTP 200, same uid, allowed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.stats import ms, percentile

MAX_OPEN_CONNECTIONS = 256
CHECKED_ANSWERS = 50


class Recorder:
    def __init__(self, bodies: list[bytes], measure_from: float) -> None:
        self.bodies = bodies
        self.uids = [json.loads(b)["request"]["uid"] for b in bodies]
        self.measure_from = measure_from
        self.latencies: list[float] = []
        self.send_lags: list[float] = []
        self.errors = 0
        self.invalid = 0
        self.checked = 0
        self.last_answer = measure_from

    async def send(self, session: aiohttp.ClientSession, url: str, index: int, due: float | None = None) -> None:
        body = self.bodies[index % len(self.bodies)]
        started = time.perf_counter()
        ok = False
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                raw = await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            raw = b""
        done = time.perf_counter()
        if started < self.measure_from:
            return
        self.latencies.append(done - started)
        if due is not None:
            self.send_lags.append(started - due)
        self.last_answer = max(self.last_answer, done)
        if not ok:
            self.errors += 1
        elif self.checked < CHECKED_ANSWERS:
            self.checked += 1
            response_part = json.loads(raw).get("response") or {}
            if response_part.get("uid") != self.uids[index % len(self.uids)] or response_part.get("allowed") is not True:
                self.invalid += 1

    def result(self, seconds: float) -> dict[str, Any]:
        span = max(self.last_answer - self.measure_from, seconds, 1e-9)
        return {
            "requests": len(self.latencies),
            "throughput_rps": round(len(self.latencies) / span, 1),
            "p50_ms": ms(percentile(self.latencies, 50)),
            "p99_ms": ms(percentile(self.latencies, 99)),
            "max_ms": ms(max(self.latencies)) if self.latencies else None,
            "errors": self.errors + self.invalid,
            "send_lag_p99_ms": ms(percentile(self.send_lags, 99)) if self.send_lags else None,
        }


async def closed_loop(url: str, context: ssl.SSLContext, bodies: list[bytes], concurrency: int,
                      warmup: float, seconds: float) -> Recorder:
    start = time.perf_counter()
    recorder = Recorder(bodies, start + warmup)
    end = start + warmup + seconds
    counter = itertools.count()
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.perf_counter() < end:
                await recorder.send(session, url, next(counter))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return recorder


async def open_loop(url: str, context: ssl.SSLContext, bodies: list[bytes], rate: float,
                    warmup: float, seconds: float) -> Recorder:
    total = int((warmup + seconds) * rate)
    connector = aiohttp.TCPConnector(limit=MAX_OPEN_CONNECTIONS, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter() + 0.05
        recorder = Recorder(bodies, start + warmup)
        tasks = []
        k = 0
        while k < total:
            due = start + k / rate
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            tasks.append(asyncio.create_task(recorder.send(session, url, k, due)))
            k += 1
        await asyncio.gather(*tasks)
    return recorder


async def run(point: dict[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=point["ca"])
    bodies = [b.encode() for b in json.loads(Path(point["bodies"]).read_text())]
    if point["mode"] == "closed":
        recorder = await closed_loop(point["url"], context, bodies, int(point["concurrency"]), point["warmup"], point["seconds"])
    else:
        recorder = await open_loop(point["url"], context, bodies, float(point["rate"]), point["warmup"], point["seconds"])
    result = recorder.result(point["seconds"])
    if point["mode"] != "closed":
        result["throughput_rps"] = round(min(result["throughput_rps"], float(point["rate"]) * 1.05), 1)
    if point.get("keep_latencies"):
        result["latencies_ms"] = [round(x * 1000.0, 4) for x in recorder.latencies]
    return result


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(asyncio.run(run(spec))), flush=True)
