//! Who sent a request: [`client_addr`], the one place the client address is decided (login
//! throttling uses it; so should anything else that counts per client).

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
