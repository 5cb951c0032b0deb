//! The deadline for a connection's first request head, kept here rather than by actix's
//! own head timer.
//!
//! actix-http's timer answers a bare `408` with no body, and it judges the deadline
//! before it reads the socket: a process paused past the deadline (a long GC-like stall, a
//! `SIGSTOP`) answered 408 to requests that had arrived in full while it was paused.
//! [`HeadDeadline`] wraps each accepted connection and reads first: a head that has
//! arrived is served, however late the process looks at it. Only a head still incomplete
//! at its deadline (a client that connects and sends nothing, or sends its head slowly) is
//! answered, with a problem document like every other error, and the connection closed.
//!
//! As with actix's timer, the deadline is for a connection's first head; between requests
//! actix's keep-alive timeout closes an idle connection, and a body has its own deadline
//! ([`super::body`]).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::HeaderMap;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep, sleep_until};

use super::middleware;

/// How much of the request line is kept to name the problem's `instance`.
const LINE_KEPT: usize = 512;

/// A connection whose first request head must arrive within its deadline.
pub struct HeadDeadline<IO> {
    io: IO,
    limit: Duration,
    deadline: Instant,
    /// Made at the first wait (a connection whose head is already there needs none).
    timer: Option<Pin<Box<Sleep>>>,
    state: State,
    /// Where the scan for the head's end stands.
    end: HeadEnd,
    /// The start of the request line, as far as it arrived.
    line: Vec<u8>,
    /// Whether the last read returned bytes (the deadline waits for actix to judge them).
    fresh: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first head has not fully arrived.
    Awaiting,
    /// It has: from here on the connection is actix's alone.
    Arrived,
    /// It did not arrive in time and was answered: reads end.
    Answered,
}

impl<IO> HeadDeadline<IO> {
    /// `io`, just accepted, whose first head must arrive within `limit`.
    pub fn new(io: IO, limit: Duration) -> Self {
        Self {
            io,
            limit,
            deadline: Instant::now() + limit,
            timer: None,
            state: State::Awaiting,
            end: HeadEnd::default(),
            line: Vec::new(),
            fresh: false,
        }
    }

    /// Takes in bytes read while the head is awaited.
    fn arrived(&mut self, bytes: &[u8]) {
        let mut kept = bytes;
        if self.line.is_empty() {
            // Blank lines before the request line are skipped, as the parser skips them.
            let blank = kept
                .iter()
                .take_while(|b| matches!(b, b'\r' | b'\n'))
                .count();
            kept = &kept[blank..];
        }
        if self.line.len() < LINE_KEPT && !self.line.contains(&b'\n') {
            let room = LINE_KEPT - self.line.len();
            self.line.extend_from_slice(&kept[..kept.len().min(room)]);
        }
        if self.end.scan(bytes) {
            self.state = State::Arrived;
            self.timer = None;
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + AsRawFd + Unpin> AsyncRead for HeadDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.state {
            State::Arrived => return Pin::new(&mut this.io).poll_read(cx, buf),
            State::Answered => return Poll::Ready(Ok(())),
            State::Awaiting => {}
        }
        // What has arrived is read before the deadline is judged.
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                this.fresh = !read.is_empty();
                this.arrived(read);
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_pending() {
            this.fresh = false;
            return Poll::Pending;
        }
        // The runtime may not know yet of bytes that arrived: a process resumed after a
        // stop wakes from `epoll_wait` interrupted (EINTR), with its timers run and the
        // sockets' news still queued. So the socket itself is read.
        match read_now(this.io.as_raw_fd(), buf.initialize_unfilled()) {
            Ok(Some(n)) => {
                buf.advance(n);
                let read = &buf.filled()[before..];
                this.fresh = n > 0;
                this.arrived(read);
                return Poll::Ready(Ok(()));
            }
            Ok(None) => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        // Bytes read just now are actix's to judge first (a head it refuses is answered,
        // and never read past): the deadline is judged at the next read that finds none.
        if std::mem::take(&mut this.fresh) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // Too late: answered here, in words, and the stream ends, so actix closes the
        // connection and writes nothing more.
        this.state = State::Answered;
        let answer = timed_out(&this.line, this.limit);
        let mut written = 0;
        while written < answer.len() {
            match Pin::new(&mut this.io).poll_write(cx, &answer[written..]) {
                Poll::Ready(Ok(n)) if n > 0 => written += n,
                // A fresh connection's send buffer takes the answer whole; should it not,
                // the connection closes all the same.
                _ => break,
            }
        }
        tracing::info!(
            limit_ms = this.limit.as_millis() as u64,
            "a request head did not arrive in time; answered 408"
        );
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeadDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Reads what the socket `fd` holds now, by the kernel's word rather than the runtime's:
/// `Some(0)` at its end, `None` when nothing is there.
fn read_now(fd: RawFd, into: &mut [u8]) -> io::Result<Option<usize>> {
    match recv(fd, into, MsgFlags::MSG_DONTWAIT) {
        Ok(n) => Ok(Some(n)),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Finds the blank line that ends a head (`\n\n` or `\n\r\n`, as actix's parser takes
/// either), across reads.
#[derive(Debug, Default)]
struct HeadEnd {
    /// 0: inside a line; 1: just after a line feed; 2: after a line feed and a return.
    at: u8,
    /// Whether anything but blank lines came yet (blank lines before a request are skipped).
    begun: bool,
}

impl HeadEnd {
    /// Whether `bytes` complete the head.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            self.at = match (self.at, b) {
                (1 | 2, b'\n') if self.begun => return true,
                (_, b'\n') => 1,
                (1, b'\r') => 2,
                (0, b'\r') => 0,
                _ => {
                    self.begun = true;
                    0
                }
            };
        }
        false
    }
}

/// The whole 408 answer: a problem document, the usual headers, and `Connection: close`.
fn timed_out(line: &[u8], limit: Duration) -> Vec<u8> {
    let request_id = middleware::new_request_id();
    let detail = format!(
        "The request did not arrive within {} ms of connecting, so it was not read. \
         Please send it again.",
        limit.as_millis()
    );
    let body = middleware::problem_text(
        StatusCode::REQUEST_TIMEOUT,
        &detail,
        &instance(line),
        &request_id,
    );
    let mut headers = HeaderMap::new();
    middleware::set_headers(&mut headers, &request_id, None, true);
    let mut answer = String::from("HTTP/1.1 408 Request Timeout\r\n");
    answer.push_str("content-type: application/problem+json\r\n");
    answer.push_str(&format!("content-length: {}\r\n", body.len()));
    answer.push_str("connection: close\r\n");
    let now = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT");
    answer.push_str(&format!("date: {now}\r\n"));
    for (name, value) in &headers {
        if let Ok(value) = value.to_str() {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    answer.push_str("\r\n");
    answer.push_str(&body);
    answer.into_bytes()
}

/// The request's path, when its request line arrived that far and reads as one (printable
/// ASCII, starting with `/`); else empty.
fn instance(line: &[u8]) -> String {
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (Some(_method), Some(target)) = (words.next(), words.next()) else {
        return String::new();
    };
    let path = target.split('?').next().unwrap_or_default();
    let plain = path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic());
    match plain && words.next().is_some() {
        true => path.to_string(),
        false => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(parts: &[&str]) -> Option<usize> {
        let mut end = HeadEnd::default();
        parts.iter().position(|part| end.scan(part.as_bytes()))
    }

    #[test]
    fn a_head_ends_at_its_blank_line_however_it_is_cut() {
        assert_eq!(ends(&["GET / HTTP/1.1\r\nHost: a\r\n\r\n"]), Some(0));
        assert_eq!(
            ends(&["GET / HTTP/1.1\r\n", "Host: a\r\n", "\r", "\n"]),
            Some(3)
        );
        assert_eq!(ends(&["GET / HTTP/1.1\nHost: a\n\n"]), Some(0));
        assert_eq!(ends(&["GET / HTTP/1.1\r\nHost: a\r\n"]), None);
        assert_eq!(ends(&["GET / HTTP/1.1\r\nHost: a\r\nX: \r\r\n"]), None);
        // Blank lines before the request line are not its end.
        assert_eq!(ends(&["\r\n\r\n", "GET / HTTP/1.1\r\n"]), None);
        assert_eq!(ends(&["\r\n", "GET / HTTP/1.1\r\n\r\n"]), Some(1));
    }

    #[test]
    fn the_answer_names_the_path_that_arrived_and_nothing_else() {
        assert_eq!(
            instance(b"GET /api/v1/orders?x=1 HTTP/1.1\r\nHo"),
            "/api/v1/orders"
        );
        assert_eq!(instance(b"POST /api/v1/ord"), "");
        assert_eq!(instance(b"GET http://evil/ HTTP/1.1"), "");
        assert_eq!(instance(b""), "");
        let mut head = HeadDeadline::new((), Duration::from_secs(1));
        head.arrived(b"\r\n");
        head.arrived(b"\r\nGET /after-blank-lines HTTP/1.1\r\nHo");
        assert_eq!(instance(&head.line), "/after-blank-lines");
        assert_eq!(head.state, State::Awaiting);
        head.arrived(b"st: a\r\n\r\n");
        assert_eq!(head.state, State::Arrived);
        let answer =
            String::from_utf8(timed_out(b"GET /x HTTP/1.1", Duration::from_secs(5))).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{head}"
        );
        assert!(head.contains("connection: close"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 408);
        assert_eq!(problem["instance"], "/x");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("within 5000 ms")
        );
    }
}
