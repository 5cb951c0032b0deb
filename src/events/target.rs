//! Where a webhook may point: `http` or `https` URLs whose host resolves only to public
//! addresses. Loopback, private (RFC 1918), carrier-grade NAT, link-local (cloud metadata
//! lives there), unique-local IPv6, multicast and unspecified addresses are refused unless
//! `STOCKADE_WEBHOOK_ALLOW_PRIVATE` is set, so an admin form cannot be turned against the
//! shop's own network (SSRF). Checked when an endpoint is made and again before every
//! delivery, since a name can resolve elsewhere later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use reqwest::Url;

/// Why a URL may not be a webhook target; the message is for the admin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the URL is not valid: {0}")]
    Malformed(String),
    #[error("only http and https URLs can receive webhooks")]
    Scheme,
    #[error("the URL must not carry a user name or password")]
    Credentials,
    #[error("{host} does not resolve to any address")]
    Unresolved { host: String },
    #[error(
        "{host} resolves to {addr}, a private, loopback or link-local address; webhooks go \
         only to public addresses (STOCKADE_WEBHOOK_ALLOW_PRIVATE allows others)"
    )]
    Private { host: String, addr: IpAddr },
}

/// Parses `raw` into a URL a webhook may be sent to, without resolving it.
pub fn parse(raw: &str) -> Result<Url, Refused> {
    let url = Url::parse(raw.trim()).map_err(|e| Refused::Malformed(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refused::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused::Credentials);
    }
    if url.host_str().is_none() {
        return Err(Refused::Malformed("it has no host".into()));
    }
    Ok(url)
}

/// Parses `raw` and resolves its host: every address must be public unless
/// `allow_private`.
pub async fn check(raw: &str, allow_private: bool) -> Result<Url, Refused> {
    let url = parse(raw)?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    // `[::1]` comes back with its brackets; the resolver wants the bare address.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((bare, port))
        .await
        .map_err(|_| Refused::Unresolved { host: host.clone() })?
        .map(|a| a.ip())
        .collect();
    if addrs.is_empty() {
        return Err(Refused::Unresolved { host });
    }
    if !allow_private && let Some(addr) = addrs.into_iter().find(|a| !is_public(*a)) {
        return Err(Refused::Private { host, addr });
    }
    Ok(url)
}

/// Whether `addr` is on the public internet.
pub fn is_public(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(a: Ipv4Addr) -> bool {
    let [b0, b1, ..] = a.octets();
    !(a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_broadcast()
        || a.is_multicast()
        || a.is_documentation()
        || b0 == 0
        // 100.64.0.0/10, carrier-grade NAT
        || (b0 == 100 && (64..128).contains(&b1))
        // 198.18.0.0/15, benchmarking; 240.0.0.0/4, reserved
        || (b0 == 198 && (b1 == 18 || b1 == 19))
        || b0 >= 240)
}

fn is_public_v6(a: Ipv6Addr) -> bool {
    let first = a.segments()[0];
    !(a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        // 64:ff9b::/96 NAT64 could reach anything; 2001:db8::/32 documentation
        || first == 0x0064
        || (first == 0x2001 && a.segments()[1] == 0x0db8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_and_link_local_addresses_are_not_public() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
        for a in ["93.184.215.14", "8.8.8.8", "2606:4700::1111"] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn only_http_and_https_without_credentials_are_accepted() {
        assert_eq!(parse("ftp://example.com/x"), Err(Refused::Scheme));
        assert_eq!(parse("file:///etc/passwd"), Err(Refused::Scheme));
        assert_eq!(parse("https://u:p@example.com/"), Err(Refused::Credentials));
        assert!(matches!(parse("not a url"), Err(Refused::Malformed(_))));
        assert!(parse("https://example.com/hooks").is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_allowed() {
        let refused = check("http://localhost:9/hook", false).await;
        assert!(
            matches!(refused, Err(Refused::Private { .. })),
            "{refused:?}"
        );
        assert!(check("http://[::1]:9/", false).await.is_err());
        assert!(check("http://127.0.0.1:9/hook", true).await.is_ok());
    }
}
