//! Commit notices as an async stream ([`Engine::subscribe_stream`]).
//!
//! Each stream has a bounded queue of its own. The writer never waits for a stream: when
//! a stream's queue is full, the writer records the first seq the stream missed and
//! skips every later notice for it. The consumer, once it has taken everything queued,
//! gets [`StreamItem::Lagged`] with that seq, and the writer delivers notices again from
//! the next commit on. A lagging consumer therefore hears explicitly where to resume,
//! never a silent gap and never a silent end.

use crate::engine::Engine;
use crate::writer::{CommitNotice, Subscriber, SUBSCRIBER_QUEUE_MAX};
use futures_channel::mpsc;
use futures_core::{FusedStream, Stream};
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// An item of a [`CommitStream`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamItem {
    /// A durable commit: one per accepted command that wrote, in commit order.
    Commit(CommitNotice),
    /// The stream's queue filled up and notices were skipped, starting with the one whose
    /// `first_seq` is `resume_from`. Every commit yielded before this item ended before
    /// `resume_from`. To catch up, read the log from `resume_from` to its tip with
    /// [`Reader::events`](crate::Reader::events) (`EventQuery { from_seq: resume_from,
    /// .. }`, page by page until `has_more` is false). The commits yielded after this item
    /// may overlap what that read returns: skip those whose seqs it already covered.
    Lagged {
        /// The first global seq the stream did not deliver.
        resume_from: u64,
    },
}

/// The seq of the first notice a stream missed, or 0 while it misses none (seqs start
/// at 1). Shared by the writer and the consumer; one lock orders the writer's failed
/// send and the consumer's check for a lag (see [`StreamSender::deliver`]).
type Missed = Arc<Mutex<u64>>;

/// The writer's end of a [`CommitStream`].
pub(crate) struct StreamSender {
    tx: mpsc::Sender<CommitNotice>,
    missed: Missed,
}

impl StreamSender {
    /// Delivers one notice, or records it as the first one missed when the stream's
    /// queue is full, or skips it while the stream is lagging. Returns false once the
    /// stream is dropped.
    ///
    /// The lock is held across the send, so the consumer checks for a lag either before
    /// this call (its queue was empty then, so the send succeeds) or after it (and sees
    /// the seq recorded here). A notice skipped here was published before the lock was
    /// taken, so the consumer, which takes the lag under the same lock before it reads
    /// the log, finds it there.
    pub(crate) fn deliver(&mut self, notice: &CommitNotice) -> bool {
        let mut missed = self.missed.lock();
        if *missed != 0 {
            return !self.tx.is_closed();
        }
        match self.tx.try_send(notice.clone()) {
            Ok(()) => true,
            Err(e) if e.is_disconnected() => false,
            Err(_) => {
                *missed = notice.first_seq;
                true
            }
        }
    }
}

/// A stream of commit notices ([`Engine::subscribe_stream`]), implementing
/// [`futures_core::Stream`] with items [`StreamItem`]. It works on any executor: the
/// writer thread wakes it. It ends after the engine is closed and everything queued
/// (and a final [`StreamItem::Lagged`], if notices were missed) has been yielded.
///
/// A consumer that falls more than its queue depth behind gets [`StreamItem::Lagged`]
/// after the items queued before the lag, then notices again from a later commit on.
#[derive(Debug)]
pub struct CommitStream {
    rx: mpsc::Receiver<CommitNotice>,
    missed: Missed,
    ended: bool,
}

impl CommitStream {
    /// The next item, or `None` once the stream has ended; the same as `StreamExt::next`
    /// of the `futures` crate, for hosts that do not depend on it.
    pub async fn recv(&mut self) -> Option<StreamItem> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// The next queued notice if the writer queued one since the queue was found empty,
    /// else the lag, if the stream has one. Under the lock the writer sends under: a
    /// lag is reported only when no notice before it is left in the queue (the writer
    /// may fill the queue and record the lag between the consumer's poll and this call).
    fn take_lag(&mut self) -> Option<StreamItem> {
        let mut missed = self.missed.lock();
        if *missed == 0 {
            return None;
        }
        if let Ok(notice) = self.rx.try_recv() {
            return Some(StreamItem::Commit(notice));
        }
        Some(StreamItem::Lagged { resume_from: std::mem::take(&mut *missed) })
    }
}

impl Stream for CommitStream {
    type Item = StreamItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.rx).poll_next(cx) {
            Poll::Ready(Some(notice)) => Poll::Ready(Some(StreamItem::Commit(notice))),
            // The queue is empty: report a lag now, or wait (the writer's next send wakes
            // this task).
            Poll::Pending => match self.take_lag() {
                Some(lag) => Poll::Ready(Some(lag)),
                None => Poll::Pending,
            },
            Poll::Ready(None) => {
                let lag = self.take_lag();
                self.ended = lag.is_none();
                Poll::Ready(lag)
            }
        }
    }
}

impl FusedStream for CommitStream {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl Engine {
    /// A [`futures_core::Stream`] of every durable commit, once each, in commit order,
    /// with a queue of [`SUBSCRIBER_QUEUE_MAX`] notices. A consumer that falls that far
    /// behind is not dropped: it gets [`StreamItem::Lagged`] with the seq to resume from
    /// (see [`StreamItem`]). Like [`Engine::subscribe`], it hears only of commits made
    /// after this call, and never of a rejection.
    pub fn subscribe_stream(&self) -> CommitStream {
        self.subscribe_stream_with_depth(SUBSCRIBER_QUEUE_MAX)
    }

    /// [`Engine::subscribe_stream`] with a queue of `depth` notices (at least one).
    pub fn subscribe_stream_with_depth(&self, depth: usize) -> CommitStream {
        // A futures channel holds its buffer plus one slot per sender; the writer is the
        // only sender.
        let (tx, rx) = mpsc::channel(depth.max(1) - 1);
        let missed = Missed::default();
        let stream = CommitStream { rx, missed: missed.clone(), ended: false };
        self.add_subscriber(Subscriber::Stream(StreamSender { tx, missed }));
        stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(seq: u64) -> CommitNotice {
        CommitNotice { first_seq: seq, last_seq: seq, sessions: Vec::new(), committed_at_ms: 0 }
    }

    /// The writer may fill the queue and record a lag between the consumer's poll that
    /// found the queue empty and its check for a lag: the notices queued before the lag
    /// still come first.
    #[test]
    fn a_lag_recorded_after_the_queue_was_found_empty_comes_after_what_was_queued() {
        let (tx, rx) = mpsc::channel(0);
        let missed = Missed::default();
        let mut stream = CommitStream { rx, missed: missed.clone(), ended: false };
        let mut sender = StreamSender { tx, missed };
        // The consumer found the queue empty; then the writer sends two notices into a
        // queue of one.
        assert!(sender.deliver(&notice(7)) && sender.deliver(&notice(8)));
        assert_eq!(stream.take_lag(), Some(StreamItem::Commit(notice(7))));
        assert_eq!(stream.take_lag(), Some(StreamItem::Lagged { resume_from: 8 }));
        assert_eq!(stream.take_lag(), None);
    }
}
