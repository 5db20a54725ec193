"""Target policy: metadata and link-local always refused, loopback allowed, the rest only when allowed."""

from __future__ import annotations

import socket

import pytest

from inferwise.calculators.errors import InputError
from inferwise.probes.policy import ENV_ALLOW, TargetPolicy


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_ALLOW, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.2:8000",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]:8000",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata/",
        # the metadata address behind a NAT64 gateway, a 6to4 relay, the old
        # IPv4-compatible form and Teredo (client 169.254.169.254, obfuscated)
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b:1::a9fe:a9fe]/",
        "http://[2002:a9fe:a9fe::]/",
        "http://[::a9fe:a9fe]/",
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
    ],
)
def test_metadata_and_link_local_are_refused_even_when_allowed(url: str) -> None:
    permissive = TargetPolicy.from_entries(
        ["169.254.0.0/16", "fe80::/10", "metadata.google.internal", "0.0.0.0/0", "::/0"]
    )
    with pytest.raises(InputError) as err:
        permissive.check(url)
    assert err.value.field == "url"


def test_translated_forms_of_allowed_addresses_still_pass() -> None:
    policy = TargetPolicy.from_entries(["::/0"])
    assert policy.check("http://[64:ff9b::a00:1]:8000/") == ["64:ff9b::a00:1"]  # 10.0.0.1
    assert policy.check("http://[2001:db8::1]/") == ["2001:db8::1"]


def test_names_are_resolved_before_the_check(monkeypatch) -> None:
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if host == "innocent.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))]
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(InputError, match="169.254.169.254"):
        TargetPolicy.from_entries(["innocent.example"]).check("http://innocent.example:8000")


def test_loopback_allowed_private_needs_an_allow() -> None:
    p = TargetPolicy()
    assert p.check("http://127.0.0.1:8000") == ["127.0.0.1"]
    assert p.check("http://localhost:8000/v1")  # resolves to loopback
    with pytest.raises(InputError, match="not allowed"):
        p.check("http://10.0.0.5:8000")
    with pytest.raises(InputError, match="not allowed"):
        p.check("http://192.168.1.20")
    assert TargetPolicy.from_entries(["10.0.0.0/8"]).check("http://10.0.0.5:8000") == ["10.0.0.5"]
    assert TargetPolicy.from_entries(["10.0.0.5"]).check("http://10.0.0.5:8000") == ["10.0.0.5"]


def test_allow_from_env_and_config_file(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ENV_ALLOW, "10.1.0.0/16, 192.168.7.7")
    assert TargetPolicy.from_environment().check("http://10.1.2.3") == ["10.1.2.3"]
    cfg = tmp_path / "cfg" / "inferwise"
    cfg.mkdir(parents=True)
    (cfg / "allow_hosts").write_text("# lab boxes\n172.16.0.9\n")
    assert TargetPolicy.from_environment().check("http://172.16.0.9:80")


def test_strict_mode_is_allowlist_only_and_ignores_the_caller() -> None:
    strict = TargetPolicy.from_environment(extra_allow=["10.0.0.5"], mode="strict")
    with pytest.raises(InputError, match="operator"):
        strict.check("http://10.0.0.5:8000")
    with pytest.raises(InputError):
        strict.check("http://127.0.0.1:8000")  # loopback only when the operator lists it
    ok = TargetPolicy.from_entries(["127.0.0.1"], mode="strict")
    assert ok.check("http://127.0.0.1:8000") == ["127.0.0.1"]


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:8000",
        "ftp://127.0.0.1/",
        "http://",
        "file:///etc/passwd",
        "http://127.0.0.1:99999",
    ],
)
def test_bad_urls_are_input_errors(url: str) -> None:
    with pytest.raises(InputError):
        TargetPolicy().check(url)


def test_unresolvable_host_is_an_input_error() -> None:
    with pytest.raises(InputError, match="cannot resolve"):
        TargetPolicy().check("http://nonexistent.invalid:8000")
