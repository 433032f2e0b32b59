//! Frames of a relayed body handed on in bursts.
//!
//! A store's HTTP response arrives in whatever pieces the socket held when it was read: from a
//! server that writes 4 KiB at a time that is mostly 4–16 KiB. Passed on one at a time as they
//! come, each piece costs a write to the client, and a wake-up and a read on its side, so a
//! relayed download spends more in system calls than in moving bytes. Held back until they add
//! up to [`AT_LEAST`] bytes and then handed on one after another, they find the connection
//! ready for all of them at once: hyper queues the frames it is given in a row and writes them
//! with one vectored write. Nothing is copied. The same holds for a body relayed to the store:
//! the server at the other end then reads it in larger pieces too.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;

use super::ByteStream;

/// The bytes held back before a burst, but for the last.
pub const AT_LEAST: usize = 128 << 10;

/// Frames held back until they add up to a burst.
#[derive(Debug, Default)]
struct Batch {
    frames: Vec<Bytes>,
    bytes: usize,
}

impl Batch {
    /// Holds `frame`; gives the batch once it holds at least [`AT_LEAST`] bytes.
    fn add(&mut self, frame: Bytes) -> Option<Vec<Bytes>> {
        self.bytes += frame.len();
        self.frames.push(frame);
        (self.bytes >= AT_LEAST).then(|| self.take())
    }

    /// What is held, however little.
    fn take(&mut self) -> Vec<Bytes> {
        self.bytes = 0;
        std::mem::take(&mut self.frames)
    }
}

/// The frames of `inner`, unchanged and in order, handed on in bursts of at least
/// [`AT_LEAST`] bytes (the last burst may be less). It waits for more rather than pass on a
/// small frame, so it suits bodies relayed as fast as they come, not streams whose pieces must
/// go out as soon as they are made.
pub fn in_bursts(inner: ByteStream) -> ByteStream {
    Box::pin(Bursts {
        inner: Some(inner),
        held: Batch::default(),
        releasing: Vec::new().into_iter(),
    })
}

struct Bursts {
    /// `None` once it has ended or failed.
    inner: Option<ByteStream>,
    held: Batch,
    /// The burst being handed on.
    releasing: std::vec::IntoIter<Bytes>,
}

impl Stream for Bursts {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.releasing.next() {
                return Poll::Ready(Some(Ok(frame)));
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(burst) = this.held.add(frame) {
                        this.releasing = burst.into_iter();
                    }
                }
                // What is held goes with the body that failed: the reader sees the error.
                Poll::Ready(Some(Err(e))) => {
                    this.inner = None;
                    this.held.take();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    this.inner = None;
                    this.releasing = this.held.take().into_iter();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::{stream, FutureExt, StreamExt};
    use tokio::sync::mpsc;

    use super::*;

    const K: usize = 1024;

    fn piece(i: usize, size: usize) -> Bytes {
        (0..size).map(|j| (i * 7 + j * 13) as u8).collect()
    }

    #[tokio::test]
    async fn frames_are_held_until_they_add_up_and_then_handed_on_unchanged() {
        let (tx, rx) = mpsc::unbounded_channel::<io::Result<Bytes>>();
        let inner = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
        let mut out = in_bursts(Box::pin(inner));
        let sent: Vec<Bytes> = (0..40).map(|i| piece(i, 4 * K)).collect();

        // 31 frames of 4 KiB are 124 KiB: nothing goes out yet.
        for frame in &sent[..31] {
            tx.send(Ok(frame.clone())).unwrap();
        }
        assert!(out.next().now_or_never().is_none());
        // The 32nd makes 128 KiB: all 32 come, in order, each ready at once.
        tx.send(Ok(sent[31].clone())).unwrap();
        for frame in &sent[..32] {
            assert_eq!(out.next().now_or_never().unwrap().unwrap().unwrap(), frame);
        }
        assert!(out.next().now_or_never().is_none());
        // The rest goes when the body ends.
        for frame in &sent[32..] {
            tx.send(Ok(frame.clone())).unwrap();
        }
        drop(tx);
        for frame in &sent[32..] {
            assert_eq!(out.next().await.unwrap().unwrap(), frame);
        }
        assert!(out.next().await.is_none());
    }

    #[tokio::test]
    async fn a_large_frame_goes_at_once() {
        let big = piece(1, AT_LEAST);
        let items = vec![Ok(big.clone()), Ok(piece(2, 10))];
        let mut out = in_bursts(Box::pin(stream::iter(items).chain(stream::pending())));
        assert_eq!(out.next().now_or_never().unwrap().unwrap().unwrap(), big);
        assert!(out.next().now_or_never().is_none());
    }

    #[tokio::test]
    async fn a_body_that_fails_ends_with_its_error() {
        let items = vec![
            Ok(Bytes::from_static(b"abc")),
            Err(io::Error::other("cut")),
            Ok(Bytes::from_static(b"never")),
        ];
        let mut out = in_bursts(Box::pin(stream::iter(items)));
        let failed = out.next().await.unwrap().unwrap_err();
        assert_eq!(failed.to_string(), "cut");
        assert!(out.next().await.is_none());
    }

    #[tokio::test]
    async fn an_empty_body_gives_no_frame() {
        assert!(in_bursts(Box::pin(stream::empty())).next().await.is_none());
    }
}
