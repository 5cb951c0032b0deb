//! A TCP proxy that fault-injection tests put between the application and PostgreSQL or
//! Redis. Its [`Mode`] can be switched while connections are open, and the switch applies
//! to them as well as to new ones: pass bytes through, delay them, swallow them (a network
//! partition), or reset every connection (a crashed peer, a firewall's RST).
//!
//! Each proxy runs on a thread and runtime of its own, like the test servers of
//! [`crate::helpers`], so it keeps serving an application whatever runtime the test runs
//! on, until it is dropped.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// What the proxy does with the connections through it, open and new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards everything as it comes.
    Pass,
    /// Forwards each chunk, in either direction, after this delay (a round trip takes at
    /// least twice as long).
    Delay(Duration),
    /// Accepts and reads, forwards nothing either way, and never closes. What it read goes
    /// through when the mode changes back, as after a healed partition.
    Blackhole,
    /// Closes every open connection with a TCP reset, and each new one as soon as it is
    /// accepted.
    Reset,
    /// Closes every open connection with a TCP reset and stops listening, so new ones are
    /// refused, as by a stopped server; listens on the same port again when the mode
    /// changes.
    Refuse,
}

/// The proxy's mode, and how many times it was set to [`Mode::Reset`] or [`Mode::Refuse`]:
/// a connection resets when the count moves, even if the mode has changed again before it
/// looked.
#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    resets: u64,
}

/// A running proxy in front of one upstream address; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    state: watch::Sender<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free port of 127.0.0.1 in front of `upstream`, passing bytes.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (state, watching) = watch::channel(State {
            mode: Mode::Pass,
            resets: 0,
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = accept(listener, upstream, watching, counter) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection's task and closes its sockets.
        });
        FaultProxy {
            addr,
            accepted,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Starts a proxy in front of the server a `postgres://` or `redis://` URL points at.
    pub fn in_front_of(url: &str) -> FaultProxy {
        let url = reqwest::Url::parse(url).expect("a URL");
        let host = url.host_str().expect("a URL with a host");
        let port = url.port().expect("a URL with a port");
        let upstream = (host, port).to_socket_addrs().unwrap().next().unwrap();
        FaultProxy::start(upstream)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far, whatever became of them.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Switches every connection, open and new, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.state.send_modify(|state| {
            state.mode = mode;
            if matches!(mode, Mode::Reset | Mode::Refuse) {
                state.resets += 1;
            }
        });
    }

    /// `url` (`postgres://…` or `redis://…`) with its host and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let mut url = reqwest::Url::parse(url).expect("a URL");
        url.set_ip_host(self.addr.ip()).expect("a URL with a host");
        url.set_port(Some(self.addr.port()))
            .expect("a URL with a port");
        url.to_string()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    accepted: Arc<AtomicU64>,
) {
    let addr = listener.local_addr().unwrap();
    let mut listening = Some(listener);
    // A copy to wait on for the mode, apart from the one each connection is handed.
    let mut mode = state.clone();
    loop {
        match &listening {
            Some(listener) => tokio::select! {
                conn = listener.accept() => if let Ok((client, _)) = conn {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(connection(client, upstream, state.clone()));
                },
                _ = mode.wait_for(|s| s.mode == Mode::Refuse) => listening = None,
            },
            None => {
                let _ = mode.wait_for(|s| s.mode != Mode::Refuse).await;
                let again = TcpListener::bind(addr).await;
                listening = Some(again.expect("the proxy's port, listened on again"));
            }
        }
    }
}

/// One client connection: connects upstream and copies both ways until both sides have
/// closed, either fails, or the proxy is set to reset.
async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut state: watch::Receiver<State>,
) {
    let State { mode, resets } = *state.borrow_and_update();
    if matches!(mode, Mode::Reset | Mode::Refuse) {
        return reset(client);
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return reset(client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let reset_requested = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let there = pump(client_read, server_write, state.clone());
        let back = pump(server_read, client_write, state.clone());
        let pumps = async { tokio::try_join!(there, back) };
        tokio::select! {
            _ = pumps => false,
            changed = state.wait_for(|s| s.resets != resets) => changed.is_ok(),
        }
    };
    if reset_requested {
        reset(client);
        reset(server);
    }
}

/// Copies `from` to `to` a chunk at a time, each forwarded as the mode allows once read.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut state: watch::Receiver<State>,
) -> std::io::Result<()> {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        // Held while blackholed (or while the connection is about to be reset).
        let forwarding = state
            .wait_for(|s| !matches!(s.mode, Mode::Blackhole | Mode::Reset | Mode::Refuse))
            .await
            .map(|s| s.mode);
        match forwarding {
            Ok(Mode::Delay(delay)) => tokio::time::sleep(delay).await,
            Ok(_) => {}
            Err(_) => return Ok(()), // the proxy is stopping
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// Closes `stream` with RST rather than FIN: no lingering, nothing left to deliver.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::time::Instant;

    use redis::AsyncConnectionConfig;

    use super::*;

    /// A server that sends back whatever it reads, on the test's runtime.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut from, mut to) = socket.split();
                    let _ = tokio::io::copy(&mut from, &mut to).await;
                });
            }
        });
        addr
    }

    /// Sends `message` and reads as many bytes back, waiting at most `wait`.
    async fn echo(
        conn: &mut TcpStream,
        message: &[u8],
        wait: Duration,
    ) -> std::io::Result<Vec<u8>> {
        conn.write_all(message).await?;
        read(conn, message.len(), wait).await
    }

    async fn read(conn: &mut TcpStream, len: usize, wait: Duration) -> std::io::Result<Vec<u8>> {
        let mut back = vec![0; len];
        match tokio::time::timeout(wait, conn.read_exact(&mut back)).await {
            Ok(read) => read.map(|_| back),
            Err(_) => Err(ErrorKind::TimedOut.into()),
        }
    }

    const WAIT: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn pass_forwards_at_once_and_delay_holds_each_chunk_both_ways() {
        let proxy = FaultProxy::start(echo_server().await);
        let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
        let started = Instant::now();
        assert_eq!(echo(&mut conn, b"quick", WAIT).await.unwrap(), b"quick");
        assert!(started.elapsed() < Duration::from_millis(200));

        proxy.set(Mode::Delay(Duration::from_millis(300)));
        let started = Instant::now();
        assert_eq!(echo(&mut conn, b"slow", WAIT).await.unwrap(), b"slow");
        // Held once on the way there and once on the way back.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(600), "{took:?}");

        proxy.set(Mode::Pass);
        let started = Instant::now();
        assert_eq!(echo(&mut conn, b"quick", WAIT).await.unwrap(), b"quick");
        assert!(started.elapsed() < Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_blackhole_answers_nothing_and_closes_nothing_until_it_lifts() {
        let proxy = FaultProxy::start(echo_server().await);
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(echo(&mut open, b"before", WAIT).await.unwrap(), b"before");

        proxy.set(Mode::Blackhole);
        let short = Duration::from_millis(500);
        // Timed out: neither an answer nor a close (which would end the read early).
        let err = echo(&mut open, b"held", short).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        let err = echo(&mut new, b"new", short).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");

        // Lifted: what was held goes through, and both connections work again.
        proxy.set(Mode::Pass);
        assert_eq!(read(&mut open, 4, WAIT).await.unwrap(), b"held");
        assert_eq!(read(&mut new, 3, WAIT).await.unwrap(), b"new");
        assert_eq!(echo(&mut open, b"after", WAIT).await.unwrap(), b"after");
    }

    #[tokio::test]
    async fn a_reset_sends_rst_to_open_and_new_connections_until_pass() {
        let proxy = FaultProxy::start(echo_server().await);
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(echo(&mut open, b"ok", WAIT).await.unwrap(), b"ok");

        proxy.set(Mode::Reset);
        // A reset, not a close: reading fails instead of ending.
        let err = read(&mut open, 1, WAIT).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
        // A new one is reset as soon as it is accepted: before or after `connect` returns.
        let new = async {
            let mut new = TcpStream::connect(proxy.addr()).await?;
            read(&mut new, 1, WAIT).await
        };
        let err = new.await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");

        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(echo(&mut again, b"back", WAIT).await.unwrap(), b"back");

        // A reset reaches open connections even when Pass follows at once.
        proxy.set(Mode::Reset);
        proxy.set(Mode::Pass);
        let err = read(&mut again, 1, WAIT).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    }

    #[tokio::test]
    async fn refuse_resets_open_connections_refuses_new_ones_and_listens_again_after() {
        let proxy = FaultProxy::start(echo_server().await);
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(echo(&mut open, b"hi", WAIT).await.unwrap(), b"hi");

        proxy.set(Mode::Refuse);
        let err = read(&mut open, 1, WAIT).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
        // The listener goes a moment after the switch.
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match TcpStream::connect(proxy.addr()).await {
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                    break;
                }
                Ok(_) => assert!(std::time::Instant::now() < deadline, "still listening"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tried = proxy.accepted();

        proxy.set(Mode::Pass);
        let deadline = std::time::Instant::now() + WAIT;
        let mut again = loop {
            match TcpStream::connect(proxy.addr()).await {
                Ok(conn) => break conn,
                Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(echo(&mut again, b"back", WAIT).await.unwrap(), b"back");
        assert!(proxy.accepted() > tried, "counted once listening again");
    }

    #[tokio::test]
    async fn redis_through_the_proxy_answers_slows_stalls_and_breaks() {
        let redis_url = &crate::helpers::servers().await.redis_url;
        let proxy = FaultProxy::in_front_of(redis_url);
        let through = proxy.url(redis_url);
        assert!(
            through.ends_with(&format!("@{}", proxy.addr())),
            "{through}"
        );
        let client = redis::Client::open(through).unwrap();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        let connect = || client.get_multiplexed_async_connection_with_config(&config);
        async fn ping(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
            redis::cmd("PING").query_async(conn).await
        }

        let mut conn = connect().await.unwrap();
        assert_eq!(ping(&mut conn).await.unwrap(), "PONG");

        proxy.set(Mode::Delay(Duration::from_millis(300)));
        let started = Instant::now();
        assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(600), "{took:?}");

        proxy.set(Mode::Blackhole);
        let err = ping(&mut conn).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");

        proxy.set(Mode::Reset);
        let err = ping(&mut conn).await.unwrap_err();
        assert!(err.is_connection_dropped(), "{err}");
        let err = connect().await.unwrap_err();
        assert!(err.is_connection_dropped(), "{err}");

        proxy.set(Mode::Pass);
        let mut fresh = connect().await.unwrap();
        assert_eq!(ping(&mut fresh).await.unwrap(), "PONG");
    }
}
