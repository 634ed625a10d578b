"""Getting the bytes behind a client's image URL without server-side request forgery.

An image URL makes the server connect wherever the client says, from inside the server's network. So
an http(s) host is resolved here and refused if any of its addresses is not public (loopback, private,
link-local with the cloud metadata service, ...), unless an operator allowed it in
`multimodal.fetch.allowed_hosts`; the connection then goes to the address that was checked, never to a
second resolution of the name (DNS rebinding), and every redirect hop is checked again. `file://` reads
only inside `multimodal.fetch.allowed_local_dir`. Errors name the host, never the URL, which may hold
secrets in its path or query.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import stat
from contextlib import AbstractAsyncContextManager
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from serve_app.config import MultimodalConfig, host_entry
from serve_app.errors import BadRequestError
from serve_app.media.images import parse_data_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
USER_AGENT = "serve-graph-image-fetcher"
_HOW_TO_ALLOW = "an operator can allow it with `multimodal.fetch.allowed_hosts`"


def is_public_address(address: IPAddress) -> bool:
    """Whether `address` is globally routable, so that connecting to it cannot reach the server's own network."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv6 address that embeds an IPv4 one (mapped, 6to4) reaches that IPv4 address.
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return is_public_address(embedded)
        if address.is_site_local:  # deprecated fec0::/10, which is_global still calls global
            return False
    # is_global alone lets multicast (224/4, ff00::/8) and reserved ranges such as ::/8 through.
    return address.is_global and not address.is_multicast and not address.is_reserved


class ImageFetcher:
    """Fetches `data:`, `http(s)://` and (when configured) `file://` image URLs; one per replica."""

    def __init__(self, config: MultimodalConfig) -> None:
        self._config = config
        self._allowed_names: set[str] = set()
        self._allowed_networks: list[IPNetwork] = []
        for entry in config.fetch.allowed_hosts:
            allowed = host_entry(entry)  # valid: the config checked it
            if isinstance(allowed, str):
                self._allowed_names.add(allowed)
            else:
                self._allowed_networks.append(allowed)
        local_dir = config.fetch.allowed_local_dir
        self._local_dir = Path(local_dir).resolve() if local_dir else None
        self._client: httpx.AsyncClient | None = None

    async def fetch(self, url: str) -> bytes:
        """The encoded image behind `url`, at most `max_image_bytes`; BadRequestError when not allowed or failed."""
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            return parse_data_url(url, self._config)
        if scheme in ("http", "https"):
            try:
                return await asyncio.wait_for(self._fetch_http(url), self._config.fetch.timeout_s)
            except (TimeoutError, httpx.TimeoutException) as exc:
                raise BadRequestError(
                    f"Fetching the image from {_host_of(url)} timed out after {self._config.fetch.timeout_s} s.",
                    code="image_fetch_failed",
                ) from exc
            except (httpx.HTTPError, UnicodeError) as exc:
                # UnicodeError: httpx reads a redirect's Location even when not following it, and a malformed
                # punycode host there (`xn--`) fails to decode.
                raise BadRequestError(
                    f"Fetching the image from {_host_of(url)} failed: {type(exc).__name__}: {exc}",
                    code="image_fetch_failed",
                ) from exc
        if scheme == "file" and self._local_dir is not None:
            return await asyncio.to_thread(self._read_local, url, self._local_dir)
        allowed = "http(s), data" + (" or file" if self._local_dir is not None else "")
        raise BadRequestError(f"Image URLs must be {allowed} URLs, not {scheme[:16]!r}.", code="url_not_allowed")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _fetch_http(self, url: str) -> bytes:
        target = _parse_http_url(url)
        for _ in range(self._config.fetch.max_redirects + 1):
            async with self._stream(target, await self._checked_address(target)) as response:
                if not response.has_redirect_location:
                    return await self._read_body(target, response)
                target = _parse_http_url(response.headers["Location"], base=target)
        raise BadRequestError(
            f"Fetching the image from {_host_of(url)} took more than {self._config.fetch.max_redirects} redirects.",
            code="image_fetch_failed",
        )

    async def _checked_address(self, url: httpx.URL) -> IPAddress:
        """The address to connect to for `url`: the first resolved, after every resolved one passed the check."""
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise BadRequestError(
                f"Cannot resolve the image host {url.host}: {exc}", code="image_fetch_failed"
            ) from exc
        addresses = [ipaddress.ip_address(str(info[4][0])) for info in infos]
        if {url.host.lower().rstrip("."), host.lower().rstrip(".")}.isdisjoint(self._allowed_names):
            for address in addresses:
                if not (is_public_address(address) or self._in_allowed_network(address)):
                    raise BadRequestError(
                        f"The image host {url.host} resolves to a non-public address, which is refused; "
                        f"{_HOW_TO_ALLOW}.",
                        code="url_not_allowed",
                    )
        return addresses[0]

    def _in_allowed_network(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._allowed_networks)

    def _stream(self, url: httpx.URL, address: IPAddress) -> AbstractAsyncContextManager[httpx.Response]:
        if self._client is None:
            self._client = httpx.AsyncClient(
                # No proxies or .netrc credentials from the environment: the checked address is where we go.
                trust_env=False,
                follow_redirects=False,
                # One client fetches for every request: a cookie one image server sets must not be kept and
                # sent again later on behalf of another client.
                cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
                timeout=self._config.fetch.timeout_s,
                # Images are compressed already; identity keeps a gzip bomb from inflating past the size limit.
                headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
                # No connection outlives its fetch: the pool would key it by the checked IP alone, so a TLS
                # connection verified for one name would be reused for another name on the same IP (a CDN)
                # without that name's certificate ever being checked.
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        host = url.raw_host.decode("ascii")
        # The request goes to the checked IP; Host and TLS SNI/certificate checks still use the real name.
        return self._client.stream(
            "GET",
            url.copy_with(host=str(address)),
            headers={"Host": url.netloc.decode("ascii")},
            extensions={"sni_hostname": host} if url.scheme == "https" else None,
        )

    async def _read_body(self, url: httpx.URL, response: httpx.Response) -> bytes:
        if not response.is_success:
            raise BadRequestError(
                f"Fetching the image from {url.host} failed: HTTP {response.status_code} {response.reason_phrase}.",
                code="image_fetch_failed",
            )
        limit = self._config.max_image_bytes
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(f"{int(declared)} bytes", limit)
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > limit:
                raise _too_large(f"more than {limit} bytes", limit)
        return bytes(body)

    def _read_local(self, url: str, local_dir: Path) -> bytes:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise BadRequestError("file:// image URLs must name a local file.", code="url_not_allowed")
        # resolve() follows symlinks and `..`, so the check below is on the file that would really be read.
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(local_dir):
            raise BadRequestError(
                "file:// image URLs may only read the directory in `multimodal.fetch.allowed_local_dir`.",
                code="url_not_allowed",
            )
        limit = self._config.max_image_bytes
        try:
            with open(path, "rb", opener=_open_nonblocking) as file:
                info = os.fstat(file.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise BadRequestError("The image file is not a regular file.", code="image_fetch_failed")
                if info.st_size > limit:
                    raise _too_large(f"{info.st_size} bytes", limit)
                data = file.read(limit + 1)
        except OSError as exc:
            raise BadRequestError(f"Cannot read the image file: {exc.strerror}.", code="image_fetch_failed") from exc
        if len(data) > limit:
            raise _too_large(f"more than {limit} bytes", limit)
        return data


def _open_nonblocking(path: str, flags: int) -> int:
    # Opening a FIFO for reading would block until something writes to it; O_NONBLOCK returns at once,
    # and the regular-file check refuses it.
    return os.open(path, flags | os.O_NONBLOCK)


def _parse_http_url(url: str, base: httpx.URL | None = None) -> httpx.URL:
    try:
        parsed = base.join(url) if base is not None else httpx.URL(url)
        host = parsed.host  # decodes a punycode host: a malformed one (`xn--`) raises a UnicodeError here
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise BadRequestError(f"The image URL is not a valid URL: {exc}", code="invalid_image_url") from exc
    if parsed.scheme not in ("http", "https"):
        # Redirects land here too: a redirect to file:// or gopher:// is never followed.
        raise BadRequestError(f"Image URLs must be http(s), not {parsed.scheme[:16]!r}.", code="url_not_allowed")
    if parsed.userinfo:
        raise BadRequestError("Image URLs must not contain credentials (user:password@).", code="url_not_allowed")
    if not host:
        raise BadRequestError("The image URL has no host.", code="invalid_image_url")
    return parsed


def _host_of(url: str) -> str:
    try:
        return httpx.URL(url).host or "the image URL"
    except (httpx.InvalidURL, UnicodeError):
        return "the image URL"


def _too_large(size: str, limit: int) -> BadRequestError:
    return BadRequestError(f"The image is {size}, larger than the limit of {limit} bytes.", code="image_too_large")
