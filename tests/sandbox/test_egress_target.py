"""The egress proxy's pure parts: request targets, the allowlist match, headers, addresses."""

from __future__ import annotations

import pytest

from turnkeeper.config import parse_egress_allowlist
from turnkeeper.errors import EgressRefusedError
from turnkeeper.sandbox.egress.proxy import forwarded_headers
from turnkeeper.sandbox.egress.target import (
    Allowlist,
    Destination,
    connect_destination,
    forward_destination,
    reachable_by_name,
)

ALLOW = Allowlist(parse_egress_allowlist("api.anthropic.com:443,127.0.0.1:8080,[::1]:9000"))


@pytest.mark.parametrize(
    ("target", "destination"),
    [
        (b"api.anthropic.com:443", Destination("api.anthropic.com", 443)),
        (b"API.Anthropic.COM.:443", Destination("api.anthropic.com", 443)),
        (b"127.0.0.1:8080", Destination("127.0.0.1", 8080)),
        (b"[::1]:9000", Destination("[::1]", 9000)),
    ],
)
def test_connect_targets_parse_and_match(target: bytes, destination: Destination) -> None:
    assert connect_destination(target) == destination
    ALLOW.check(destination)


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        (b"http://127.0.0.1:8080/v1/x?q=1", Destination("127.0.0.1", 8080, "/v1/x?q=1")),
        (b"HTTP://127.0.0.1:8080", Destination("127.0.0.1", 8080, "/")),
        (b"http://127.0.0.1:8080?q", Destination("127.0.0.1", 8080, "/?q")),
        (b"http://127.0.0.1:8080/a#frag", Destination("127.0.0.1", 8080, "/a")),
        (b"http://example.org/", Destination("example.org", 80, "/")),
        (b"http://[::1]:9000/", Destination("[::1]", 9000, "/")),
    ],
)
def test_absolute_urls_parse_into_host_port_and_origin_form(
    url: bytes, destination: Destination
) -> None:
    assert forward_destination(url) == destination


def test_the_host_header_omits_only_port_80() -> None:
    assert Destination("example.org", 80).host_header == "example.org"
    assert Destination("127.0.0.1", 8080).host_header == "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (b"localhost:8080", "not-allowlisted"),
        (b"127.1:8080", "not-allowlisted"),
        (b"0x7f.1:8080", "not-allowlisted"),
        (b"2130706433:8080", "not-allowlisted"),
        (b"[::ffff:127.0.0.1]:8080", "not-allowlisted"),
        (b"[0::1]:9000", "not-allowlisted"),
        (b"127.0.0.1:8081", "not-allowlisted"),
        (b"api.anthropic.com:80", "not-allowlisted"),
        (b"api.anthropic.com..:443", "not-allowlisted"),
        (b"evil.api.anthropic.com:443", "not-allowlisted"),
        (b"user:pw@127.0.0.1:8080", "userinfo"),
        (b"127.0.0.1\t:8080", "control-characters"),
        ("127.0.0.\u0131:8080".encode(), "not-ascii"),
    ],
)
def test_other_spellings_are_blocked(target: bytes, reason: str) -> None:
    with pytest.raises(EgressRefusedError) as caught:
        ALLOW.check(connect_destination(target))
    assert (caught.value.status, caught.value.reason) == (403, reason)


def test_logged_hosts_are_escaped_and_carry_no_credentials() -> None:
    with pytest.raises(EgressRefusedError) as caught:
        connect_destination(b"alice:s3cret@127.0.0.1:8080")
    assert caught.value.fields == {"host": "127.0.0.1", "port": 8080}
    assert "s3cret" not in str(caught.value)
    with pytest.raises(EgressRefusedError) as caught:
        connect_destination(b"a\x1b[31mb:8080")
    assert caught.value.fields == {"host": "a\\x1b[31mb", "port": 8080}


@pytest.mark.parametrize(
    "target",
    [b"127.0.0.1", b"127.0.0.1:", b":8080", b"127.0.0.1:0", b"127.0.0.1:65536", b"h:+80"],
)
def test_connect_without_a_valid_port_or_host_is_malformed(target: bytes) -> None:
    with pytest.raises(EgressRefusedError) as caught:
        connect_destination(target)
    assert (caught.value.status, caught.value.reason) == (400, "malformed-request")


@pytest.mark.parametrize(
    "url", [b"/relative", b"*", b"https://a.example/", b"ftp://a.example/", b"http:///x"]
)
def test_urls_the_proxy_does_not_forward_are_malformed(url: bytes) -> None:
    with pytest.raises(EgressRefusedError) as caught:
        forward_destination(url)
    assert (caught.value.status, caught.value.reason) == (400, "malformed-request")


@pytest.mark.parametrize(
    ("address", "reachable"),
    [
        ("160.79.104.10", True),
        ("2607:6bc0::10", True),
        ("10.0.0.5", True),  # a private gateway may be the operator's model API
        ("127.0.0.1", False),
        ("127.0.1.1", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("fe80::1%eth0", False),
        ("0.0.0.0", False),  # noqa: S104 - an address to refuse, not to bind
        ("::", False),
        ("224.0.0.1", False),
    ],
)
def test_a_name_never_leads_to_the_hosts_loopback_or_link_local(
    address: str, reachable: bool
) -> None:
    assert reachable_by_name(address) is reachable


def test_hop_by_hop_headers_are_dropped() -> None:
    headers = [
        (b"host", b"a"),
        (b"connection", b"keep-alive, x-secret"),
        (b"x-secret", b"1"),
        (b"keep-alive", b"5"),
        (b"proxy-authorization", b"Basic x"),
        (b"proxy-connection", b"keep-alive"),
        (b"te", b"trailers"),
        (b"trailer", b"x"),
        (b"upgrade", b"h2c"),
        (b"expect", b"100-continue"),
        (b"content-type", b"text/plain"),
        (b"authorization", b"Bearer kept"),
    ]
    assert forwarded_headers(headers) == [
        (b"content-type", b"text/plain"),
        (b"authorization", b"Bearer kept"),
    ]


def test_chunked_framing_wins_over_a_content_length() -> None:
    headers = [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")]
    assert forwarded_headers(headers) == [(b"transfer-encoding", b"chunked")]
