//! The body read timeout: a request whose body has not fully arrived
//! `STOCKADE_BODY_TIMEOUT_MS` after its head is answered 408 and its connection closed, so
//! a client that stops mid-body cannot hold a connection and a worker's attention forever.
//! (actix-web times out the head, not the body.)

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::HttpMessage;
use actix_web::dev::{Payload, ServiceRequest};
use actix_web::error::PayloadError;
use actix_web::http::header;
use actix_web::web::Bytes;
use futures_util::Stream;
use std::future::Future;

/// Set when a request's body ran out of time.
#[derive(Debug, Clone, Default)]
pub struct BodyTimedOut(Arc<AtomicBool>);

impl BodyTimedOut {
    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Gives `req`'s body (if it has one) a deadline `timeout` from now; the returned flag says
/// afterwards whether the deadline passed before the body was read.
pub fn limit(req: &mut ServiceRequest, timeout: Duration) -> BodyTimedOut {
    let flag = BodyTimedOut::default();
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if has_body {
        let inner = req.take_payload();
        let stream = Deadline {
            inner,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            flag: flag.clone(),
            timeout,
        };
        let boxed: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> = Box::pin(stream);
        req.set_payload(Payload::from(boxed));
    }
    flag
}

struct Deadline {
    inner: Payload,
    sleep: Pin<Box<tokio::time::Sleep>>,
    flag: BodyTimedOut,
    timeout: Duration,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // What has arrived is passed on first: a body complete in time is never refused.
        if let Poll::Ready(item) = Pin::new(&mut self.inner).poll_next(cx) {
            return Poll::Ready(item);
        }
        if self.flag.happened() {
            return Poll::Ready(None);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.flag.0.store(true, Ordering::Relaxed);
                let message = format!(
                    "the request body did not arrive within {} ms",
                    self.timeout.as_millis()
                );
                Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    message,
                )))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
