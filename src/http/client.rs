//! Who sent a request: [`client_addr`], the one place the client address is decided (login
//! throttling uses it; so should anything else that counts per client), and [`asked_for`],
//! the one place the scheme and host the client asked for are decided (cookies' Secure,
//! the Origin check). Both believe forwarding headers only from `STOCKADE_TRUSTED_PROXIES`:
//! from anyone else they are the client's own words. (actix's `connection_info()` believes
//! `Forwarded`/`X-Forwarded-*` from every peer, so nothing here uses it.)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use actix_web::HttpRequest;

use crate::config::{Settings, canonical_ip};

/// The address of the client that sent `req`.
///
/// - The peer (the TCP connection's other end) is the client unless it is one of
///   `STOCKADE_TRUSTED_PROXIES`; then `X-Forwarded-For` is ignored, whatever it says.
/// - From a trusted proxy, the `X-Forwarded-For` hops are read from the right (the hop the
///   nearest proxy appended) leftwards, and the first that is not a trusted proxy is the
///   client. Hops further left were written by the client itself and are never believed,
///   so rotating them does not change the answer. A hop that is not an address ends the
///   walk at the proxy that passed it on; when every hop is a trusted proxy, the left-most
///   one is the client.
///
/// IPv4-mapped IPv6 addresses are given as IPv4. A request without a peer (only in unit
/// tests) is `0.0.0.0`.
pub fn client_addr(req: &HttpRequest, settings: &Settings) -> IpAddr {
    let peer = req
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| canonical_ip(a.ip()));
    let hops = req
        .headers()
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect::<Vec<_>>();
    from_hops(peer, &hops, settings)
}

/// The scheme and host a request was sent to, as the client's browser saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// `http` or `https`.
    pub scheme: String,
    /// `host` or `host:port`, as in the `Host` header.
    pub host: String,
}

impl Asked {
    /// `scheme://host`, as a browser writes it in `Origin`.
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.host)
    }
}

/// The scheme and host `req` was sent to. From a trusted proxy, `X-Forwarded-Proto` and
/// `X-Forwarded-Host` say them (the right-most value: the one the nearest proxy wrote);
/// from any other peer those headers are ignored: the scheme is http (Stockade's
/// listeners are plain), and `Host` says the host (else the listener's address). `settings` is `None` only in unit
/// tests without the app state; then no proxy is trusted.
pub fn asked_for(req: &HttpRequest, settings: Option<&Settings>) -> Asked {
    let peer = req
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| canonical_ip(a.ip()));
    let trusted = settings.is_some_and(|s| s.is_trusted_proxy(peer));
    let forwarded = |name: &str| {
        trusted
            .then(|| {
                req.headers()
                    .get_all(name)
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .map(str::trim)
                    .rfind(|v| !v.is_empty())
                    .map(str::to_ascii_lowercase)
            })
            .flatten()
    };
    let scheme = forwarded("x-forwarded-proto")
        .filter(|p| p == "http" || p == "https")
        // Stockade's own listeners are plain HTTP; TLS ends at a proxy in front.
        .unwrap_or_else(|| "http".into());
    let host = forwarded("x-forwarded-host").unwrap_or_else(|| {
        req.headers()
            .get(actix_web::http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .or_else(|| req.app_data::<super::Listener>().map(|on| on.0.to_string()))
            .unwrap_or_default()
    });
    Asked { scheme, host }
}

fn from_hops(peer: IpAddr, hops: &[&str], settings: &Settings) -> IpAddr {
    let mut client = peer;
    for hop in hops.iter().rev() {
        if !settings.is_trusted_proxy(client) {
            break;
        }
        match parse_hop(hop) {
            Some(addr) => client = addr,
            None => break,
        }
    }
    client
}

/// `1.2.3.4`, `1.2.3.4:5678`, `::1` or `[::1]:5678`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    let addr = hop
        .parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse().ok())
        })?;
    Some(canonical_ip(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(trusted: &str) -> Settings {
        Settings {
            trusted_proxies: trusted
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect(),
            ..Settings::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn forwarded_request(peer: &str) -> HttpRequest {
        actix_web::test::TestRequest::default()
            .peer_addr(format!("{peer}:4000").parse().unwrap())
            .insert_header(("host", "shop.example:8080"))
            .insert_header(("x-forwarded-proto", "https"))
            .insert_header(("x-forwarded-host", "evil.example, shop.example"))
            .to_http_request()
    }

    #[test]
    fn forwarded_scheme_and_host_are_believed_only_from_a_trusted_proxy() {
        let untrusted = asked_for(&forwarded_request("203.0.113.7"), Some(&settings("")));
        assert_eq!(untrusted.origin(), "http://shop.example:8080");
        let no_state = asked_for(&forwarded_request("127.0.0.1"), None);
        assert_eq!(no_state.origin(), "http://shop.example:8080");
        let s = settings("127.0.0.1");
        let proxied = asked_for(&forwarded_request("127.0.0.1"), Some(&s));
        // The nearest proxy's word, not what the client wrote before it.
        assert_eq!(proxied.origin(), "https://shop.example");
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_header_says() {
        let s = settings("");
        assert_eq!(
            from_hops(ip("127.0.0.1"), &["6.6.6.6"], &s),
            ip("127.0.0.1")
        );
        let s = settings("10.0.0.0/8");
        assert_eq!(
            from_hops(ip("203.0.113.7"), &["6.6.6.6"], &s),
            ip("203.0.113.7")
        );
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let s = settings("127.0.0.1,10.0.0.0/8,fd00::/8");
        let peer = ip("127.0.0.1");
        assert_eq!(from_hops(peer, &["198.51.100.2"], &s), ip("198.51.100.2"));
        // The client wrote the left-most hops itself; they are never believed.
        assert_eq!(
            from_hops(peer, &["1.1.1.1", "198.51.100.2", "10.1.2.3"], &s),
            ip("198.51.100.2")
        );
        assert_eq!(
            from_hops(peer, &["garbage", "[2001:db8::5]:443", "fd00::1"], &s),
            ip("2001:db8::5")
        );
        assert_eq!(from_hops(peer, &["::ffff:192.0.2.1"], &s), ip("192.0.2.1"));
        // An unreadable hop stops at the proxy that passed it on.
        assert_eq!(
            from_hops(peer, &["not an ip", "10.0.0.9"], &s),
            ip("10.0.0.9")
        );
        // Only proxies: the left-most.
        assert_eq!(
            from_hops(peer, &["10.0.0.1", "10.0.0.2"], &s),
            ip("10.0.0.1")
        );
        // No header: the proxy itself.
        assert_eq!(from_hops(peer, &[], &s), peer);
    }
}
