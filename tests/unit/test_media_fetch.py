"""ImageFetcher against a real HTTP server on 127.0.0.1: refusals, allow-lists, redirects and limits.

No test reaches beyond 127.0.0.1: public hosts are stood in for by a fake resolver that maps test names to
the local server, which also shows that the fetcher connects to the address it checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from PIL import Image

from serve_app.config import ImageFetchConfig, MultimodalConfig
from serve_app.errors import BadRequestError
from serve_app.media.fetch import ImageFetcher, is_public_address
from tests.unit.media_support import data_url, encode

PNG = encode(Image.new("RGB", (4, 4), (255, 0, 0)), "PNG")
LIMIT = 100_000
_stop = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        try:
            if path == "/img.png":
                self._reply(200, PNG)
            elif path == "/echo-host":
                self._reply(200, self.headers["Host"].encode())
            elif path == "/cookie":
                self.send_response(200)
                self.send_header("Set-Cookie", "session=abc; Path=/")
                self._reply_body(self.headers.get("Cookie", "").encode())
            elif path.startswith("/redirect/"):
                left = int(path.rsplit("/", 1)[1])  # redirects still to come
                self._redirect(f"/redirect/{left - 1}" if left > 1 else "/img.png")
            elif path == "/to":
                self._redirect(unquote(query))
            elif path == "/slow":
                self._drip()
            elif path == "/huge":
                self._stream_forever()
            elif path == "/declared-huge":
                self.send_response(200)
                self.send_header("Content-Length", str(10**9))
                self.end_headers()
            else:
                self._reply(404, b"not here")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the fetcher hung up, which is what several tests want

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self._reply_body(body)

    def _reply_body(self, body: bytes) -> None:
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _drip(self) -> None:
        # Each byte comes well within a per-read timeout, so only a bound on the whole fetch stops it.
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        for _ in range(100):
            if _stop.wait(0.05):
                return
            self.wfile.write(b"x")
            self.wfile.flush()

    def _stream_forever(self) -> None:
        self.send_response(200)
        self.end_headers()
        for _ in range(1000):
            self.wfile.write(b"\x00" * 65536)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    _stop.set()
    server.shutdown()
    server.server_close()


def config(**fetch: Any) -> MultimodalConfig:
    return MultimodalConfig(max_image_bytes=LIMIT, fetch=ImageFetchConfig(**fetch))


async def fetch(url: str, **fetch_config: Any) -> bytes:
    fetcher = ImageFetcher(config(**fetch_config))
    try:
        return await fetcher.fetch(url)
    finally:
        await fetcher.aclose()


async def refused(url: str, **fetch_config: Any) -> BadRequestError:
    with pytest.raises(BadRequestError) as info:
        await fetch(url, **fetch_config)
    return info.value


@pytest.fixture
def resolve_as(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes the running loop resolve the given names to the given addresses, and nothing else."""

    def install(names: dict[str, list[str]]) -> None:
        async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
            if host not in names:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in names[host]]

        monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)

    return install


NON_PUBLIC = "127.0.0.1 10.1.2.3 172.16.0.1 192.168.1.1 169.254.169.254 100.64.0.1 0.0.0.0 240.0.0.1 224.0.0.1"
NON_PUBLIC_V6 = "::1 fe80::1 fc00::1 ::ffff:127.0.0.1 ff02::1 fec0::1 ::7f00:1 2002:7f00:1::"


@pytest.mark.parametrize("address", (NON_PUBLIC + " " + NON_PUBLIC_V6).split())
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


async def test_loopback_is_refused_by_default(port: int) -> None:
    for host in ("127.0.0.1", "localhost"):
        error = await refused(f"http://{host}:{port}/img.png")
        assert error.code == "url_not_allowed"
        assert "allowed_hosts" in error.message


@pytest.mark.parametrize("allowed", ["127.0.0.1", "127.0.0.0/8"])
async def test_allowed_hosts_let_loopback_through(port: int, allowed: str) -> None:
    assert await fetch(f"http://127.0.0.1:{port}/img.png", allowed_hosts=[allowed]) == PNG


async def test_allowed_name_connects_to_the_checked_address(port: int, resolve_as: Any) -> None:
    resolve_as({"images.test": ["127.0.0.1"]})
    body = await fetch(f"http://IMAGES.test:{port}/echo-host", allowed_hosts=["images.test"])
    assert body == f"images.test:{port}".encode()


async def test_one_non_public_address_refuses_the_name(port: int, resolve_as: Any) -> None:
    resolve_as({"rebind.test": ["8.8.8.8", "10.0.0.1"]})
    assert (await refused(f"http://rebind.test:{port}/img.png")).code == "url_not_allowed"


async def test_cookies_are_not_kept(port: int) -> None:
    fetcher = ImageFetcher(config(allowed_hosts=["127.0.0.1"]))
    try:
        assert [await fetcher.fetch(f"http://127.0.0.1:{port}/cookie") for _ in range(2)] == [b"", b""]
    finally:
        await fetcher.aclose()


async def test_no_connection_is_reused_across_fetches() -> None:
    # A keep-alive server: the fetcher must still open a connection a fetch (see `_stream`'s limits).
    peers: list[int] = []

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[1])
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PNG) + PNG)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            writer.close()

    server = await asyncio.start_server(keep_alive, "127.0.0.1", 0)
    fetcher = ImageFetcher(config(allowed_hosts=["127.0.0.1"]))
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/img.png"
        assert [await fetcher.fetch(url) for _ in range(2)] == [PNG, PNG]
    finally:
        await fetcher.aclose()
        server.close()
    assert len(peers) == 2  # a connection a fetch


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("https://xn--zz.example/img.png", "invalid_image_url"),
        ("http://xn--/", "invalid_image_url"),
        ("http://127.0.0.1:{port}/to?http://xn--/", "image_fetch_failed"),  # the image server's redirect
    ],
)
async def test_malformed_punycode_host_is_a_400(port: int, url: str, code: str) -> None:
    assert (await refused(url.format(port=port), allowed_hosts=["127.0.0.1"])).code == code


async def test_unresolvable_host(resolve_as: Any) -> None:
    resolve_as({})
    error = await refused("https://nowhere.test/img.png")
    assert error.code == "image_fetch_failed"
    assert "nowhere.test" in error.message


async def test_redirects_are_followed_up_to_the_limit(port: int) -> None:
    allowed = {"allowed_hosts": ["127.0.0.1"], "max_redirects": 2}
    assert await fetch(f"http://127.0.0.1:{port}/redirect/2", **allowed) == PNG
    error = await refused(f"http://127.0.0.1:{port}/redirect/3", **allowed)
    assert (error.code, "more than 2 redirects" in error.message) == ("image_fetch_failed", True)


@pytest.mark.parametrize(
    "location",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:{port}/img.png",
        "http://10.255.255.1/",
        "file:///etc/passwd",
    ],
)
async def test_redirect_to_a_refused_address(port: int, location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{port}/to?{location.format(port=port)}"
    streamed: list[str] = []
    stream = ImageFetcher._stream

    def recorded(self: ImageFetcher, target: Any, address: Any) -> Any:
        streamed.append(str(target))
        return stream(self, target, address)

    monkeypatch.setattr(ImageFetcher, "_stream", recorded)
    assert (await refused(url, allowed_hosts=["127.0.0.1"])).code == "url_not_allowed"
    assert streamed == [url]  # the redirect's target was refused without a connection


async def test_slow_body_times_out(port: int) -> None:
    start = time.perf_counter()
    error = await refused(f"http://127.0.0.1:{port}/slow", allowed_hosts=["127.0.0.1"], timeout_s=0.5)
    assert (error.code, "timed out" in error.message) == ("image_fetch_failed", True)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("path", ["/huge", "/declared-huge"])
async def test_body_over_the_size_limit(port: int, path: str) -> None:
    error = await refused(f"http://127.0.0.1:{port}{path}", allowed_hosts=["127.0.0.1"])
    assert error.code == "image_too_large"


async def test_http_error_status(port: int) -> None:
    error = await refused(f"http://127.0.0.1:{port}/missing.png", allowed_hosts=["127.0.0.1"])
    assert (error.code, "HTTP 404" in error.message, "127.0.0.1" in error.message) == ("image_fetch_failed", True, True)


async def test_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    error = await refused(f"http://127.0.0.1:{closed_port}/img.png", allowed_hosts=["127.0.0.1"])
    assert error.code == "image_fetch_failed"


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/img.png", "gopher://127.0.0.1:70/", "javascript:alert(1)", "file:///etc/passwd"]
)
async def test_other_schemes_are_refused(url: str) -> None:
    assert (await refused(url, allowed_hosts=["127.0.0.0/8"])).code == "url_not_allowed"


async def test_credentials_in_the_url_are_refused(port: int) -> None:
    error = await refused(f"http://user:s3cret@127.0.0.1:{port}/img.png", allowed_hosts=["127.0.0.1"])
    assert error.code == "url_not_allowed"
    assert "s3cret" not in error.message


async def test_data_url_needs_no_network() -> None:
    assert await fetch(data_url(PNG)) == PNG


async def test_local_files_only_inside_the_allowed_directory(tmp_path: Path) -> None:
    images, outside = tmp_path / "images", tmp_path / "secret.png"
    images.mkdir()
    (images / "ok.png").write_bytes(PNG)
    (images / "big.png").write_bytes(b"\x00" * (LIMIT + 1))
    outside.write_bytes(PNG)
    (images / "link.png").symlink_to(outside)
    local = {"allowed_local_dir": str(images)}

    assert (await refused(f"file://{images}/ok.png")).code == "url_not_allowed"
    assert await fetch(f"file://{images}/ok.png", **local) == PNG
    assert await fetch(f"file://localhost{images}/ok%2Epng", **local) == PNG
    for escape in (f"file://{images}/../secret.png", f"file://{images}/%2e%2e/secret.png", f"file://{images}/link.png"):
        assert (await refused(escape, **local)).code == "url_not_allowed", escape
    assert (await refused(f"file://{images}/big.png", **local)).code == "image_too_large"
    assert (await refused(f"file://{images}/missing.png", **local)).code == "image_fetch_failed"
    assert (await refused(f"file://{images}", **local)).code == "image_fetch_failed"
    assert (await refused(f"file://otherhost{images}/ok.png", **local)).code == "url_not_allowed"
