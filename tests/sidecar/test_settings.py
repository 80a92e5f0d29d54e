from pathlib import Path

import pytest

from sidecar import settings
from sidecar.settings import SettingsError, command_line, parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 1024**2),
        ("2Gi", 2 * 1024**3),
        ("10GB", 10 * 1000**3),
        ("1048576", 1048576),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("64k", 64000),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert settings.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1Gi", "0", "12 parsecs", "1Zi"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        settings.parse_size(text)


def test_format_size_round_trips() -> None:
    for size in (1, 1023, 1024, 3 * 1024**2, 1024**3, 5 * 1024**4):
        assert settings.parse_size(settings.format_size(size)) == size


def test_host_globs() -> None:
    globs = settings.parse_host_globs(" A.example.org, *.s3.amazonaws.com,,a.example.org ")
    assert globs == ("a.example.org", "*.s3.amazonaws.com")
    assert settings.host_matches("bucket.s3.amazonaws.com", globs)
    assert settings.host_matches("A.EXAMPLE.ORG.", globs)
    assert not settings.host_matches("s3.amazonaws.com.evil.org", globs)
    assert not settings.host_matches("xa.example.org", globs)
    assert settings.host_matches("cas-bridge.xethub.hf.co", settings.DEFAULT_INTERCEPT)


@pytest.mark.parametrize("bad", ["https://a.org", "a.org:443", "a.org/path", "a b"])
def test_host_globs_reject(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid host pattern"):
        settings.parse_host_globs(bad)


def test_parse_defaults_and_env() -> None:
    s = parse(["--buffer-dir", "/b"], {})
    assert s.buffer_dir == Path("/b")
    assert (s.listen_host, s.listen_port, s.admin_port) == ("127.0.0.1", 3128, 3129)
    assert s.buffer_size == 1024**3 and s.eviction == "none" and not s.revalidate
    assert s.intercept == settings.DEFAULT_INTERCEPT
    assert s.remember_ca_rejections == 3600

    env = {
        "BURSTBUFFER_BUFFER_DIR": "/env",
        "BURSTBUFFER_BUFFER_SIZE": "2Gi",
        "BURSTBUFFER_REVALIDATE": "true",
        "BURSTBUFFER_EVICTION": "lru",
        "BURSTBUFFER_REMEMBER_CA_REJECTIONS": "600",
    }
    s = parse(["--buffer-size", "512MiB"], env)
    assert s.buffer_dir == Path("/env")
    assert s.buffer_size == 512 * 1024**2  # the flag wins over the variable
    assert s.revalidate and s.eviction == "lru" and s.remember_ca_rejections == 600


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--buffer-dir"),
        (["--buffer-dir", "/b", "--buffer-size", "lots"], {}, "--buffer-size: invalid size"),
        (["--buffer-dir", "/b"], {"BURSTBUFFER_EVICTION": "fifo"}, "BURSTBUFFER_EVICTION"),
        (["--buffer-dir", "/b", "--listen-port", "99999"], {}, "--listen-port"),
        (["--buffer-dir", "/b"], {"BURSTBUFFER_REVALIDATE": "maybe"}, "BURSTBUFFER_REVALIDATE"),
        (["--buffer-dir", "/b", "--upstream-proxy", "proxy:3128"], {}, "--upstream-proxy"),
        (["--buffer-dir", "/b", "--remember-ca-rejections", "0"], {}, "--remember-ca-rejections"),
    ],
)
def test_parse_errors_name_the_flag(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse(argv, env)


def test_command_line_round_trips() -> None:
    argv = command_line(
        buffer_dir="/buf",
        buffer_size=3 * 1024**3,
        intercept=("a.org", "*.b.org"),
        revalidate=True,
        http_freshness=("pypi.org", "*.Hub.example"),
        upstream_proxy=None,
        admin_host="0.0.0.0",
    )
    assert argv == [
        "--admin-host", "0.0.0.0",
        "--buffer-dir", "/buf",
        "--buffer-size", "3GiB",
        "--intercept", "a.org,*.b.org",
        "--revalidate",
        "--http-freshness", "pypi.org,*.hub.example",
    ]  # fmt: skip
    s = parse(argv, {})
    assert s.buffer_size == 3 * 1024**3 and s.intercept == ("a.org", "*.b.org") and s.revalidate
    assert s.http_freshness == ("pypi.org", "*.hub.example")
    assert parse(["--buffer-dir", "/b"], {}).http_freshness == ()
    assert command_line(http_freshness=()) == []
    with pytest.raises(TypeError, match="bogus"):
        command_line(bogus=1)


def test_parents_repeat_or_separate_by_commas() -> None:
    s = parse(
        ["--buffer-dir", "/b", "--parent", "http://squid-0:3128", "--parent", "https://s1:3129/"],
        {},
    )
    assert s.parent == ("http://squid-0:3128", "https://s1:3129")
    s = parse(["--buffer-dir", "/b"], {"BURSTBUFFER_PARENT": "http://a:1, http://b:2,http://a:1"})
    assert s.parent == ("http://a:1", "http://b:2")
    assert parse(["--buffer-dir", "/b"], {}).parent == ()
    argv = command_line(buffer_dir="/b", parent=("http://a:1", "http://b:2"), parent_timeout=2.5)
    assert argv == [
        "--buffer-dir", "/b", "--parent", "http://a:1", "--parent", "http://b:2",
        "--parent-timeout", "2.5",
    ]  # fmt: skip
    assert parse(argv, {}).parent == ("http://a:1", "http://b:2")


@pytest.mark.parametrize("bad", ["squid:3128", "ftp://squid", "http://squid:3128/path", "http://"])
def test_bad_parent_is_named(bad: str) -> None:
    with pytest.raises(SettingsError, match="--parent: invalid parent"):
        parse(["--buffer-dir", "/b", "--parent", bad], {})
