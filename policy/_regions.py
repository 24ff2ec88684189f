"""The `regions:` section: the fleet's regions, the global ledger's leases, crossing.

What lives here: `RegionsConfig` and its reader. Without the section (or with an empty
`list`) the fleet is one region, as before. The design is docs/contributors/regions.md;
the lease arithmetic is budget.leases, the lease holder extproc.runtime.region_agent.

```yaml
regions:
  this: eu                      # this deployment's region (`slogate serve --region` wins)
  list:
    eu: {ingress: "10.0.1.10:10000"}   # the region's Envoy, where peers send crossing traffic
    us: {ingress: "10.0.2.10:10000"}
  ledger:
    url: redis://global-ledger:6379/0
    report_interval_s: 1.0
    lease_s: 10.0
    fallback_for_s: 120.0
    limits_fallback: share      # share | closed
    fallback_share: last        # last (the share last held) | a fraction, capped at the share held
    spend_fallback: closed      # closed | share
  crossing:
    enabled: true
    tiers: [sheddable]
    tenants: [batch-co]
    from_level: 2
    max_added_ms: 200
    secret_file: /etc/slogate/regions.key
tenants:
  list:
    acme: {scope: global}       # one budget worldwide; `region` (the default): one per region
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from policy._reader import PolicyError, Section, expect, one_of, positive
from policy.domain import Tier

# A region's name goes into metric labels, Redis keys and an Envoy cluster name.
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


class Fallback(StrEnum):
    SHARE = "share"  # a region cut off past its lease serves on a fixed share
    CLOSED = "closed"  # ... or admits nothing against the global budget


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    # host:port of the region's Envoy listener that peers send crossing requests to;
    # None: the region takes no crossing traffic.
    ingress: str | None = None


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    url: str = ""  # the global ledger's Redis; required when regions are on
    report_interval_s: float = 1.0
    lease_s: float = 10.0  # a region's shares hold this long after the report
    timeout_ms: float = 500.0  # one report's round trip; slower counts as cut off
    # Every region's floor, so a region without demand can start; small, since a region
    # can hold at most 1 - (regions - 1) x this (0.96 of three regions').
    min_share: float = 0.02
    # After the lease, a cut-off region's fallback lasts this. The ledger holds the
    # fallback share for it as long, so a region that died costs the others its share for
    # lease_s + this: two minutes, not the ten it was (the simulator's finding).
    fallback_for_s: float = 120.0
    limits_fallback: str = Fallback.SHARE.value
    # The fallback share of the limits: None = the share the region last held; a fraction
    # is capped at the share held (more could already be the other regions').
    fallback_share: float | None = None
    spend_fallback: str = Fallback.CLOSED.value


@dataclass(frozen=True, slots=True)
class CrossingConfig:
    enabled: bool = False
    # Who may be sent to another region: a request whose tier is listed, or whose tenant is.
    tiers: frozenset[Tier] = frozenset({Tier.SHEDDABLE})
    tenants: frozenset[str] = frozenset()
    from_level: int = 2  # the local pool's breaker level (L2) from which requests cross
    max_added_ms: float = 200.0  # a peer further than this (measured round trip) is skipped
    secret_file: str | None = None  # the regions' shared HMAC key; required when enabled
    token_ttl_s: float = 30.0  # how long a crossing token is good for


@dataclass(frozen=True, slots=True)
class RegionsConfig:
    this: str | None = None  # None: one region (the section is absent)
    regions: Mapping[str, Region] = field(default_factory=dict)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    crossing: CrossingConfig = field(default_factory=CrossingConfig)

    @property
    def enabled(self) -> bool:
        return self.this is not None

    def peers(self, this: str | None = None) -> tuple[Region, ...]:
        """The other regions than `this` (`slogate serve --region`; None: `self.this`)."""
        this = this or self.this
        return tuple(r for name, r in sorted(self.regions.items()) if name != this)


def _name(value: str, path: str) -> str:
    if not value or not set(value) <= _NAME_CHARS or value[0] == "-":
        raise PolicyError(
            f"{path}: {value!r} is not a region name (lower-case letters, digits and '-')"
        )
    return value


def _ledger(sec: Section) -> LedgerConfig:
    share = sec.raw("fallback_share")
    fallback_share: float | None = None
    if share is not None and share != "last":
        fallback_share = expect(share, float, sec.child("fallback_share"))
        if not 0.0 <= fallback_share <= 1.0:
            raise PolicyError(
                f"{sec.child('fallback_share')}: must be 'last' or within [0, 1], got {share}"
            )
    config = sec.config(
        LedgerConfig,
        fallback_share=fallback_share,
        limits_fallback=one_of(sec, "limits_fallback", Fallback, Fallback.SHARE),
        spend_fallback=one_of(sec, "spend_fallback", Fallback, Fallback.CLOSED),
    )
    sec.close()
    if not config.url:
        raise PolicyError(f"{sec.child('url')}: required field is missing (the global ledger)")
    for name in ("report_interval_s", "lease_s", "timeout_ms"):
        positive(getattr(config, name), sec.child(name))
    if config.fallback_for_s < 0:
        raise PolicyError(f"{sec.child('fallback_for_s')}: must be >= 0")
    if not 0.0 <= config.min_share < 1.0:
        raise PolicyError(f"{sec.child('min_share')}: must be within [0, 1)")
    if config.lease_s < 2 * config.report_interval_s:
        # A lease must outlive the next report, or every region drops to its fallback
        # between two reports.
        raise PolicyError(
            f"{sec.child('lease_s')}: {config.lease_s} s must be at least twice "
            f"report_interval_s ({config.report_interval_s} s)"
        )
    return config


def _crossing(sec: Section, regions: Mapping[str, Region]) -> CrossingConfig:
    tiers_raw = sec.raw("tiers")
    tiers = CrossingConfig().tiers
    if tiers_raw is not None:
        names = expect(tiers_raw, list, sec.child("tiers"))
        known = {t.value for t in Tier}
        for name in names:
            if name not in known:
                raise PolicyError(
                    f"{sec.child('tiers')}: {name!r} is not a tier ({', '.join(sorted(known))})"
                )
        tiers = frozenset(Tier(n) for n in names)
        if Tier.CRITICAL in tiers:
            # Critical traffic is the latency-sensitive kind that stays local; a critical
            # tenant that tolerates the added latency is listed by name instead.
            raise PolicyError(
                f"{sec.child('tiers')}: the critical tier never crosses by its tier; "
                "list the tenants that may cross in crossing.tenants"
            )
    tenants_raw = sec.raw("tenants")
    tenants = frozenset(
        expect(t, str, sec.child("tenants"))
        for t in (expect(tenants_raw, list, sec.child("tenants")) if tenants_raw else [])
    )
    secret = sec.raw("secret_file")
    config = sec.config(
        CrossingConfig,
        tiers=tiers,
        tenants=tenants,
        secret_file=None if secret is None else expect(secret, str, sec.child("secret_file")),
    )
    sec.close()
    if config.from_level not in (1, 2, 3):
        raise PolicyError(f"{sec.child('from_level')}: must be 1, 2 or 3")
    positive(config.max_added_ms, sec.child("max_added_ms"))
    positive(config.token_ttl_s, sec.child("token_ttl_s"))
    if config.enabled:
        if config.secret_file is None:
            raise PolicyError(
                f"{sec.child('secret_file')}: crossing needs the regions' shared secret "
                "(a file of at least 32 random bytes, the same in every region)"
            )
        if not any(r.ingress for r in regions.values()):
            raise PolicyError(f"{sec.child('enabled')}: no region in regions.list has an ingress")
    return config


def parse_regions(sec: Section) -> RegionsConfig:
    listed = sec.raw("list")
    if sec.raw("this") is None and not listed:
        sec.section("ledger")
        sec.section("crossing")
        sec.close()
        return RegionsConfig()
    this = _name(sec.require("this", str), sec.child("this"))
    entries = sec.section("list")
    regions: dict[str, Region] = {}
    for name in sorted(expect(listed or {}, dict, sec.child("list"))):
        path = entries.child(str(name))
        _name(str(name), path)
        entry = entries.section(str(name))
        ingress = entry.raw("ingress")
        entry.close()
        if ingress is not None:
            ingress = expect(ingress, str, f"{path}.ingress")
            host, _, port = ingress.rpartition(":")
            if not host or not port.isdigit():
                raise PolicyError(f"{path}.ingress: expected host:port, got {ingress!r}")
        regions[str(name)] = Region(str(name), ingress)
    entries.close()
    if this not in regions:
        raise PolicyError(f"{sec.child('this')}: {this!r} is not in regions.list")
    ledger = _ledger(sec.section("ledger"))
    crossing = _crossing(sec.section("crossing"), regions)
    sec.close()
    return RegionsConfig(this=this, regions=regions, ledger=ledger, crossing=crossing)
