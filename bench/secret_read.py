"""What reading the record-MAC key costs an init: `aws.secrets.read_secret` in fresh processes, against moto's
server on loopback over http and, through a TLS forwarder with a throwaway CA (bench/tls.py), over https; and
the same read with boto3 for comparison (what the reader avoids importing).

    .venv/bin/python bench/secret_read.py [--samples N]

Each sample is a new interpreter (the rows' samples interleaved) that imports the reader, reads one Secrets
Manager secret or one SSM SecureString and reports, in milliseconds of wall and CPU time: the import, the first
read (connection, TLS context and handshake, signing, the answer), a second read in the same process (the request
alone), and how many modules the whole took; one row first imports what a layer's init with the lean DynamoDB
client has already imported (http.client, ssl, json, the trust module), which leaves the read's own share.
Bytecode is compiled by a discarded first run. moto answers in a few milliseconds of its own, so the request
figures are loopback's and moto's, not AWS's; the import and the CPU figures are the layer's. It prints
medians; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

KEY = "bench-record-mac-key-0123456789abcdef0123456789"
TOKEN = "IQoJb3JpZ2luX2VjE" + "".join(f"{n * 2654435761 % 4294967296:08x}" for n in range(135))

LAYER_PROBE = """
import sys, time
if sys.argv[2] == "warm":  # what a layer's init with the lean DynamoDB client has imported before the read
    import http.client, json, ssl, threading, urllib.parse, hashlib, hmac, idempotency_layer.aws.trust
before = len(sys.modules)
w0, c0 = time.perf_counter(), time.process_time()
from idempotency_layer.aws.secrets import read_secret
w1, c1 = time.perf_counter(), time.process_time()
import os
first = read_secret(sys.argv[1], os.environ, time.monotonic() + 5)
w2, c2 = time.perf_counter(), time.process_time()
second = read_secret(sys.argv[1], os.environ, time.monotonic() + 5)
w3, c3 = time.perf_counter(), time.process_time()
assert first == second and len(first) > 0
print(w1 - w0, c1 - c0, w2 - w1, c2 - c1, w3 - w2, c3 - c2, len(sys.modules) - before)
"""

BOTO3_PROBE = """
import sys, time
before = len(sys.modules)
w0, c0 = time.perf_counter(), time.process_time()
import boto3
w1, c1 = time.perf_counter(), time.process_time()
kind, _, name = sys.argv[1].partition(":")
client = boto3.client(kind)
first = (client.get_secret_value(SecretId=name)["SecretString"] if kind == "secretsmanager"
         else client.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
w2, c2 = time.perf_counter(), time.process_time()
second = (client.get_secret_value(SecretId=name)["SecretString"] if kind == "secretsmanager"
          else client.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
w3, c3 = time.perf_counter(), time.process_time()
assert first == second
print(w1 - w0, c1 - c0, w2 - w1, c2 - c1, w3 - w2, c3 - c2, len(sys.modules) - before)
"""

COLUMNS = ("import wall", "import cpu", "1st read wall", "1st read cpu", "2nd read wall", "2nd read cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(endpoint: str, cafile: Path | None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT / "layer"), "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_SESSION_TOKEN": TOKEN, "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true"}
    if cafile is not None:
        env["AWS_CA_BUNDLE"] = str(cafile)
    return env


def _sample(probe: str, source: str, start: str, env: dict[str, str]) -> list[float]:
    done = subprocess.run([sys.executable, "-c", probe, source, start], env=env, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"the probe failed: {done.stderr[-1500:]}")
    return [float(x) for x in done.stdout.split()]


def _rows(rows: list[tuple[str, str, str, str, dict[str, str]]], samples: int) -> None:
    """Every row's samples, interleaved (one of each in turn), so that a change of the machine's load falls on
    all rows alike; then each row's medians."""
    for _, probe, source, start, env in rows:
        _sample(probe, source, start, env)  # bytecode compiled, caches warm: not counted
    runs: list[list[list[float]]] = [[] for _ in rows]
    for _ in range(samples):
        for index, (_, probe, source, start, env) in enumerate(rows):
            runs[index].append(_sample(probe, source, start, env))
    for (label, *_), row in zip(rows, runs, strict=True):
        medians = [statistics.median(run[i] for run in row) * 1000 for i in range(6)]
        modules = int(statistics.median(run[6] for run in row))
        print(f"| {label} | " + " | ".join(f"{m:.1f}" for m in medians) + f" | {modules} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=15)
    samples = parser.parse_args().samples

    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    from tls import TLSForwarder, certificates

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    forwarder = None
    try:
        http = f"http://127.0.0.1:{port}"
        options = {"endpoint_url": http, "region_name": "us-east-1", "aws_access_key_id": "bench",
                   "aws_secret_access_key": "bench-secret"}
        boto3.client("secretsmanager", **options).create_secret(Name="bench/record-mac", SecretString=KEY)
        boto3.client("ssm", **options).put_parameter(Name="/bench/record-mac", Value=KEY, Type="SecureString")
        with tempfile.TemporaryDirectory() as folder:
            made = certificates(Path(folder))
            forwarder = TLSForwarder(("127.0.0.1", port), made.cert, made.key)
            plain, tls = _environment(http, None), _environment(forwarder.endpoint, made.ca)
            print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
                  f"{os.getloadavg()[0]:.1f} at the start, {samples} fresh processes a row, medians in ms")
            print("| read | " + " | ".join(COLUMNS) + " | modules |")
            print("|---|" + "---:|" * (len(COLUMNS) + 1))
            secret, parameter = "secretsmanager:bench/record-mac", "ssm:/bench/record-mac"
            _rows([
                ("read_secret, Secrets Manager, http", LAYER_PROBE, secret, "cold", plain),
                ("read_secret, SSM, http", LAYER_PROBE, parameter, "cold", plain),
                ("read_secret, Secrets Manager, https", LAYER_PROBE, secret, "cold", tls),
                ("read_secret, Secrets Manager, https, after the layer's imports", LAYER_PROBE, secret, "warm", tls),
                ("boto3, Secrets Manager, http", BOTO3_PROBE, secret, "cold", plain),
                ("boto3, Secrets Manager, https", BOTO3_PROBE, secret, "cold", tls),
            ], samples)
            print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        if forwarder is not None:
            forwarder.close()
        server.stop()


if __name__ == "__main__":
    main()
