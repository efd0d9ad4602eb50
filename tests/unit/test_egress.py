"""The egress gateway's pure parts: endpoints, allowlists, squid's configuration, the parsing of
its log into denials (sandbox/docker/egress.py). The gateway itself is tested live in
tests/security/test_egress.py and tests/e2e/test_egress.py."""

from __future__ import annotations

import ipaddress

import pytest

from sandbox.addresses import refused_networks
from sandbox.docker.egress import (
    parse_denial,
    proxy_environment,
    render_hosts,
    render_squid_conf,
)
from sandbox.network import (
    EgressConfig,
    Endpoint,
    base_url_endpoint,
    parse_endpoints,
)


def test_endpoint_needs_a_host_and_a_port() -> None:
    assert Endpoint.parse("API.Example.com.:443") == Endpoint("api.example.com", 443)
    assert Endpoint.parse("[fd00::1]:8443") == Endpoint("fd00::1", 8443)
    assert str(Endpoint("fd00::1", 8443)) == "[fd00::1]:8443"
    for bad in ("example.com", "example.com:0", "example.com:70000", "exa mple.com:1", ":443"):
        with pytest.raises(ValueError):
            Endpoint.parse(bad)
    assert parse_endpoints(" b.test:2, a.test:1,b.test:2 ,") == (
        Endpoint("a.test", 1),
        Endpoint("b.test", 2),
    )


def test_base_url_endpoint_takes_the_schemes_port() -> None:
    assert base_url_endpoint("https://llm.test/v1") == "llm.test:443"
    assert base_url_endpoint("http://llm.test/v1") == "llm.test:80"
    assert base_url_endpoint("https://user:pw@llm.test:8443/v1?x=1") == "llm.test:8443"
    assert base_url_endpoint(None) is None
    assert base_url_endpoint("llm.test") is None


def test_allowlist_is_the_harnesses_plus_the_base_url_only_when_policy_allows() -> None:
    allow = {"pi": (Endpoint("a.test", 443),)}
    strict = EgressConfig(allow=allow)
    assert strict.allowlist("pi", "b.test:8443") == (Endpoint("a.test", 443),)
    assert strict.allowlist("codex") == ()
    producer = EgressConfig(allow=allow, allow_base_url=True)
    assert producer.allowlist("pi", "b.test:8443") == (
        Endpoint("a.test", 443),
        Endpoint("b.test", 8443),
    )


def test_squid_conf_allows_each_client_its_own_endpoints_and_refuses_the_rest() -> None:
    config = EgressConfig(hosts={"model.test": "172.17.0.1"}, resolvers=("10.0.0.53",))
    conf = render_squid_conf(
        config,
        {
            "172.30.240.3": (Endpoint("model.test", 8443), Endpoint("api.test", 443)),
            "172.30.240.4": (Endpoint("model.test", 8443), Endpoint("api.test", 443)),
            "172.30.240.5": (Endpoint("10.1.2.3", 22),),
            "172.30.240.6": (),
        },
    )
    lines = conf.splitlines()
    # The management interface first, the catch-all refusal last.
    assert lines.index("http_access deny manager") < lines.index("http_access deny all")
    assert lines[-1] == "http_access deny all"
    assert "acl g0 src 172.30.240.5" in lines  # one group per allowlist
    assert "acl g1 src 172.30.240.3 172.30.240.4" in lines
    assert "acl g1p443_name dstdomain -n api.test" in lines
    assert "acl g1p8443_name dstdomain -n model.test" in lines
    # An allowed name resolving to a private address is refused unless pinned.
    assert "http_access deny g1 g1p443_port g1p443_name !pinned to_private" in lines
    assert "http_access allow g1 g1p443_port g1p443_name" in lines
    # An IP literal in an allowlist is allowed as it is (the operator named it).
    assert "http_access allow g0 g0p22_port g0p22_ipname g0p22_ip" in lines
    assert "172.30.240.6" not in conf  # nothing allowed: no rule at all
    assert "dns_nameservers 10.0.0.53" in lines
    assert "acl pinned dstdomain -n model.test" in lines
    # The refusal of private destinations is sandbox.addresses' rule, whole: every network
    # it refuses, IPv6 forms carrying a private IPv4 address included.
    private = [
        n for line in lines if line.startswith("acl to_private dst ") for n in line.split()[3:]
    ]
    assert private == list(refused_networks())
    networks = [ipaddress.ip_network(n) for n in private]
    for address in ("127.0.0.1", "169.254.169.254", "224.0.0.1", "fec0::1", "64:ff9b::a9fe:a9fe"):
        assert any(ipaddress.ip_address(address) in n for n in networks), address
    for address in ("8.8.8.8", "64:ff9b::808:808", "2606:4700::1111"):
        assert not any(ipaddress.ip_address(address) in n for n in networks), address
    assert render_hosts(config) == "172.17.0.1 model.test\n"


def test_squid_log_lines_become_denials_naming_the_rule() -> None:
    line = (
        "harness-access 1796084583.325 172.30.240.3 CONNECT forbidden.test:4443 403 "
        "TCP_DENIED ERR_HARNESS_NOT_ALLOWED"
    )
    denial = parse_denial(line)
    assert denial is not None
    assert (denial.client, denial.host, denial.port, denial.protocol, denial.rule) == (
        "172.30.240.3",
        "forbidden.test",
        4443,
        "http",
        "not-allowed",
    )
    assert denial.at == pytest.approx(1796084583.325)
    assert denial.describe() == "denied through the proxy forbidden.test:4443 (not-allowed)"
    private = parse_denial(
        "harness-access 1.0 172.30.240.3 GET http://sneaky.test/x 403 TCP_DENIED ERR_HARNESS_PRIVATE"
    )
    assert private is not None and (private.host, private.port, private.rule) == (
        "sneaky.test",
        80,
        "private-address",
    )
    tunnel = "harness-access 1.0 172.30.240.3 CONNECT model.test:443 200 TCP_TUNNEL -"
    assert parse_denial(tunnel) is None


def test_rejected_packets_and_dns_queries_become_denials() -> None:
    packet = (
        "Dec  1 00:23:03 491e17b045f1 harness-denied IN=eth1 OUT=eth0 MAC=02:42 "
        "SRC=172.30.240.3 DST=172.17.0.1 LEN=48 TOS=00 PREC=0x00 TTL=63 ID=1124 DF PROTO=UDP "
        "SPT=54167 DPT=53 LEN=28 MARK=0x0"
    )
    denial = parse_denial(packet)
    assert denial is not None
    assert (denial.client, denial.host, denial.port, denial.protocol, denial.rule) == (
        "172.30.240.3",
        "172.17.0.1",
        53,
        "udp",
        "direct",
    )
    assert denial.describe() == "denied direct udp 172.17.0.1:53 (direct)"
    icmp = parse_denial(
        "x harness-denied IN=eth1 OUT= SRC=172.30.240.3 DST=172.30.240.1 PROTO=ICMP"
    )
    assert (
        icmp is not None and icmp.port is None and icmp.describe().endswith("172.30.240.1 (direct)")
    )
    query = parse_denial(
        "Dec  1 00:23:03 dnsmasq[12]: query[A] Secret.Tunnel.test from 172.30.240.3"
    )
    assert query is not None and (query.host, query.protocol, query.rule) == (
        "secret.tunnel.test",
        "dns",
        "dns-lookup",
    )
    assert parse_denial("Dec  1 00:23:03 dnsmasq[12]: config secret.test is NXDOMAIN") is None
    assert parse_denial("2026/12/01 00:19:25| Accepting HTTP Socket connections") is None


def test_runs_get_the_proxy_variables_and_keep_loopback_local() -> None:
    env = proxy_environment(EgressConfig(subnet="172.30.250.0/24", port=3128))
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://172.30.250.1:3128"
    assert "127.0.0.1" in env["NO_PROXY"] and "*" not in env["NO_PROXY"]


def test_status_shows_the_network_and_the_allowlist() -> None:
    from worker.cli.render import record_rows
    from worker.store.records import RunRecord

    record = RunRecord(
        run_id="r" + "0" * 24,
        status="idle",
        network="egress",
        egress_allow=["api.anthropic.com:443", "llm.test:8443"],
    )
    assert RunRecord.decode(record.encode()).egress_allow == record.egress_allow
    rows = dict(record_rows(record.as_dict(), now=0.0))
    assert rows["network"] == "egress"
    assert rows["egress_allow"] == "api.anthropic.com:443\nllm.test:8443"
    keys = [key for key, _ in record_rows(record.as_dict(), now=0.0)]
    assert keys.index("sandbox") < keys.index("network") < keys.index("egress_allow")


def test_denials_are_counted_by_harness_and_rule() -> None:
    from prometheus_client import REGISTRY

    from worker.observe import metrics

    def count(rule: str) -> float:
        value = REGISTRY.get_sample_value(
            "harness_egress_denied_total", {"harness": "pi", "rule": rule}
        )
        return value or 0.0

    before = count("direct"), count("not-allowed")
    metrics.egress_denied("pi", ["direct", "not-allowed", "direct"])
    assert (count("direct"), count("not-allowed")) == (before[0] + 2, before[1] + 1)
