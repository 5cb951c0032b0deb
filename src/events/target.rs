//! Where a webhook may point: `http` or `https` URLs whose host resolves only to public
//! addresses. Loopback, private (RFC 1918), carrier-grade NAT, link-local (cloud metadata
//! lives there), unique- and site-local IPv6, multicast, unspecified and reserved addresses
//! are refused, and so are the IPv6 forms that carry one of them inside (IPv4-mapped and
//! -compatible, 6to4, NAT64, Teredo), unless `STOCKADE_WEBHOOK_ALLOW_PRIVATE` is set, so an
//! admin form cannot be turned against the shop's own network (SSRF).
//!
//! A name is checked when an endpoint is made, and again by the [`Resolver`] that the
//! dispatcher's HTTP client connects through: it looks the name up once per connection,
//! checks every address and hands the client only those, so nothing can answer the check
//! with a public address and the connection with a private one (DNS rebinding).

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;

/// Why a URL may not be a webhook target; the message is for the admin. No message starts
/// with the host, so making it a sentence never changes how the host is spelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the URL is not valid: {0}")]
    Malformed(String),
    #[error("only http and https URLs can receive webhooks")]
    Scheme,
    #[error("the URL must not carry a user name or password")]
    Credentials,
    #[error("the host {host} does not resolve to any address")]
    Unresolved { host: String },
    #[error("{}", private_message(host, addr))]
    Private { host: String, addr: IpAddr },
}

fn private_message(host: &str, addr: &IpAddr) -> String {
    let what = if literal(host) == Some(*addr) {
        format!("the address {host} is")
    } else {
        format!("the host {host} resolves to {addr}, which is")
    };
    format!(
        "{what} not a public address (it is private, loopback, link-local or reserved, or \
         leads to such an address); webhooks go only to public addresses \
         (STOCKADE_WEBHOOK_ALLOW_PRIVATE allows others)"
    )
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
/// `allow_private`. For making an endpoint; sends go through [`Resolver::client`].
pub async fn check(raw: &str, allow_private: bool) -> Result<Url, Refused> {
    Resolver::system(allow_private).check(raw).await
}

/// Checks `url`'s host when it is written as an address, which a client connects to
/// without resolving; a name is checked when the client resolves it to connect.
pub fn check_literal(url: &Url, allow_private: bool) -> Result<(), Refused> {
    let host = url.host_str().unwrap_or_default();
    match literal(host) {
        Some(addr) if !allow_private && !is_public(addr) => Err(Refused::Private {
            host: host.into(),
            addr,
        }),
        _ => Ok(()),
    }
}

/// The address a host is written as (`127.0.0.1`, `[::1]`), if it is one: such a host is
/// connected to as written, never looked up.
fn literal(host: &str) -> Option<IpAddr> {
    // `[::1]` comes with its brackets; the address is inside.
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Looks a host name up: its addresses (any port). The system's resolver in production; a
/// test gives its own to play a name server that changes its answer.
pub type Lookup = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>
        + Send
        + Sync,
>;

/// Resolves webhook hosts and refuses any answer with an address that is not public
/// (unless private targets are allowed). The dispatcher's HTTP client resolves through
/// it, so the addresses checked are the addresses connected to: one lookup, no second.
#[derive(Clone)]
pub struct Resolver {
    lookup: Lookup,
    allow_private: bool,
}

impl Resolver {
    /// The system's resolver (`getaddrinfo`, as `tokio::net::lookup_host`).
    pub fn system(allow_private: bool) -> Self {
        let lookup: Lookup = Arc::new(|host: String| {
            Box::pin(
                async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.collect()) },
            )
        });
        Self::with_lookup(lookup, allow_private)
    }

    /// A resolver that asks `lookup`, and checks its answers as the system's are.
    pub fn with_lookup(lookup: Lookup, allow_private: bool) -> Self {
        Self {
            lookup,
            allow_private,
        }
    }

    /// `host`'s addresses, every one checked: looked up once, or the address itself when
    /// the host is written as one.
    pub async fn addresses(&self, host: &str) -> Result<Vec<SocketAddr>, Refused> {
        let addrs = match literal(host) {
            Some(ip) => vec![SocketAddr::new(ip, 0)],
            None => (self.lookup)(host.to_string())
                .await
                .map_err(|_| Refused::Unresolved { host: host.into() })?,
        };
        if addrs.is_empty() {
            return Err(Refused::Unresolved { host: host.into() });
        }
        // One address that is not public refuses the whole answer: a client tries the
        // next address when one fails, so any of them may be the one it reaches.
        if !self.allow_private
            && let Some(a) = addrs.iter().find(|a| !is_public(a.ip()))
        {
            return Err(Refused::Private {
                host: host.into(),
                addr: a.ip(),
            });
        }
        Ok(addrs)
    }

    /// Parses `raw` and checks its host's addresses.
    pub async fn check(&self, raw: &str) -> Result<Url, Refused> {
        let url = parse(raw)?;
        self.addresses(url.host_str().unwrap_or_default()).await?;
        Ok(url)
    }

    /// An HTTP client for webhooks that connects only to addresses this resolver checked.
    pub fn client(self, timeout: Duration) -> reqwest::Result<reqwest::Client> {
        crate::install_tls_provider();
        reqwest::Client::builder()
            .timeout(timeout)
            .dns_resolver(self)
            // A proxy would look the name up itself, past the check.
            .no_proxy()
            // A redirect could lead past the address check; receivers answer, not forward.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("Stockade-Webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
    }
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let me = self.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = me.addresses(&host).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The refusal inside a send's error, when the resolver refused the host.
pub fn refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut source = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<Refused>() {
            return Some(refused);
        }
        source = s.source();
    }
    None
}

/// Whether `addr` is on the public internet.
pub fn is_public(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
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
    let s = a.segments();
    // The IPv4 address in the last 32 bits, or in bits 16–47 for 6to4.
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        // ::ffff:0:0/96, IPv4-mapped: the IPv4 address itself.
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => is_public_v4(v4(hi, lo)),
        // ::/96, IPv4-compatible (deprecated, and `::`, `::1`); ::ffff:0:0:0/96,
        // IPv4-translated: nothing public is reached this way.
        [0, 0, 0, 0, 0, 0, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => false,
        // 64:ff9b::/96, NAT64: the gateway connects to the IPv4 address inside.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => is_public_v4(v4(hi, lo)),
        // The rest of 64::/16 (64:ff9b:1::/48 is a network's own NAT64); 100::/64, discard.
        [0x64, ..] | [0x100, 0, 0, 0, ..] => false,
        // 2001::/32, Teredo: a tunnel to an IPv4 address that cannot be checked;
        // 2001:db8::/32, documentation.
        [0x2001, 0, ..] | [0x2001, 0xdb8, ..] => false,
        // 2002::/16, 6to4: the relay forwards to the IPv4 address inside.
        [0x2002, hi, lo, ..] => is_public_v4(v4(hi, lo)),
        [first, second, ..] => {
            !(a.is_multicast()
                // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                // 3fff::/20, documentation
                || (first == 0x3fff && second < 0x1000))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn refused(addrs: &[&str]) {
        for a in addrs {
            assert!(!is_public(a.parse().unwrap()), "{a} is taken for public");
        }
    }

    fn public(addrs: &[&str]) {
        for a in addrs {
            assert!(is_public(a.parse().unwrap()), "{a} is taken for private");
        }
    }

    #[test]
    fn private_loopback_and_link_local_addresses_are_not_public() {
        refused(&[
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
        ]);
        public(&[
            "93.184.215.14",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ]);
    }

    #[test]
    fn ipv4_compatible_addresses_are_refused_whatever_they_carry() {
        // `[::127.0.0.1]` is `::7f00:1`; some stacks still route it to 127.0.0.1.
        refused(&[
            "::127.0.0.1",
            "::10.0.0.1",
            "::169.254.169.254",
            "::8.8.8.8",
        ]);
    }

    #[test]
    fn ipv4_translated_addresses_are_refused() {
        refused(&["::ffff:0:127.0.0.1", "::ffff:0:8.8.8.8"]);
    }

    #[test]
    fn six_to_four_is_refused_when_its_ipv4_address_is_private() {
        // 2002:7f00:1:: is 6to4 of 127.0.0.1; 2002:a9fe:a9fe:: of the metadata address.
        refused(&[
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:101::",
        ]);
        public(&["2002:5db8:d70e::1"]);
    }

    #[test]
    fn nat64_is_refused_when_its_ipv4_address_is_private_and_local_nat64_always() {
        refused(&[
            "64:ff9b::7f00:1",
            "64:ff9b::a00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::5db8:d70e",
        ]);
        public(&["64:ff9b::5db8:d70e"]);
    }

    #[test]
    fn teredo_is_refused() {
        refused(&["2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::1"]);
    }

    #[test]
    fn site_local_documentation_and_discard_addresses_are_refused() {
        refused(&["fec0::1", "feff::1", "2001:db8::1", "3fff::1", "100::1"]);
        public(&["2001:4860:4860::8888", "3fff:1000::1"]);
    }

    #[tokio::test]
    async fn the_audits_ipv6_urls_are_refused() {
        for url in [
            "http://[::127.0.0.1]/hook",
            "http://[2002:7f00:1::]/hook",
            "http://[fec0::1]/hook",
        ] {
            let answer = check(url, false).await;
            assert!(
                matches!(answer, Err(Refused::Private { .. })),
                "{url}: {answer:?}"
            );
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

    #[test]
    fn messages_made_sentences_keep_the_host_as_typed() {
        let named = Refused::Private {
            host: "localhost".into(),
            addr: "127.0.0.1".parse().unwrap(),
        };
        let said = crate::text::sentence(&named.to_string());
        assert!(
            said.starts_with(
                "The host localhost resolves to 127.0.0.1, which is not a public address"
            ),
            "{said}"
        );
        let written = Refused::Private {
            host: "[::1]".into(),
            addr: "::1".parse().unwrap(),
        };
        let said = crate::text::sentence(&written.to_string());
        assert!(
            said.starts_with("The address [::1] is not a public address"),
            "{said}"
        );
        let unknown = Refused::Unresolved {
            host: "ip6-localhost".into(),
        };
        assert_eq!(
            crate::text::sentence(&unknown.to_string()),
            "The host ip6-localhost does not resolve to any address."
        );
    }

    /// A lookup that answers `answers` in turn (the last one from then on), counting calls.
    fn scripted(answers: &[&str], calls: Arc<AtomicUsize>) -> Lookup {
        let answers: Vec<Vec<SocketAddr>> = answers
            .iter()
            .map(|a| {
                a.split(',')
                    .map(|ip| SocketAddr::new(ip.parse().unwrap(), 0))
                    .collect()
            })
            .collect();
        Arc::new(move |_host: String| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let answer = answers[n.min(answers.len() - 1)].clone();
            Box::pin(async move { Ok(answer) })
        })
    }

    #[tokio::test]
    async fn one_private_address_in_an_answer_refuses_the_whole_answer() {
        let calls = Arc::new(AtomicUsize::new(0));
        let resolver =
            Resolver::with_lookup(scripted(&["93.184.215.14,127.0.0.1"], calls.clone()), false);
        let answer = resolver.addresses("mixed.example").await;
        assert!(matches!(answer, Err(Refused::Private { .. })), "{answer:?}");
        let allowed =
            Resolver::with_lookup(scripted(&["93.184.215.14,127.0.0.1"], calls.clone()), true);
        assert_eq!(allowed.addresses("mixed.example").await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn an_address_written_as_the_host_is_checked_without_a_lookup() {
        let calls = Arc::new(AtomicUsize::new(0));
        let resolver = Resolver::with_lookup(scripted(&["93.184.215.14"], calls.clone()), false);
        assert!(resolver.check("http://[::1]:9/").await.is_err());
        assert!(resolver.check("http://8.8.8.8/").await.is_ok());
        let url = parse("http://127.0.0.1:9/").unwrap();
        assert!(check_literal(&url, false).is_err());
        assert!(check_literal(&url, true).is_ok());
        assert!(check_literal(&parse("http://rebind.example/").unwrap(), false).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    /// A name server that answered the check with a public address and every later lookup
    /// with 127.0.0.1: the client resolves through the resolver, so it is refused every
    /// time and never reaches the listener on 127.0.0.1.
    #[tokio::test]
    async fn the_client_connects_only_to_addresses_its_resolver_checked() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let reached = Arc::new(AtomicUsize::new(0));
        let counter = reached.clone();
        let accepting = tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let calls = Arc::new(AtomicUsize::new(0));
        let resolver = Resolver::with_lookup(
            scripted(&["93.184.215.14", "127.0.0.1"], calls.clone()),
            false,
        );
        let url = format!("http://rebind.example:{port}/hook");
        resolver.check(&url).await.expect("public when checked");
        let client = resolver.client(Duration::from_secs(5)).unwrap();
        for _ in 0..20 {
            let e = client.post(&url).body("{}").send().await.unwrap_err();
            let refused = refusal(&e);
            assert!(matches!(refused, Some(Refused::Private { .. })), "{e:?}");
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "a send reached 127.0.0.1"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            21,
            "one lookup per connection"
        );
        accepting.abort();
    }
}
