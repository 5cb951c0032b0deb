//! A queue served by one leader task while it has work: group commit's shape, for the
//! batches of orders and holds, their sold-out answers, and the lots of confirmations.
//!
//! The first item sent to an idle lane starts its leader, which takes what is ready in lots
//! and leaves when its queue runs dry. It leaves under the lane's lock, after seeing the
//! queue empty, so an item is never sent to a leader that is gone: the next one starts a
//! new leader.

use std::sync::Mutex;

use tokio::sync::mpsc;

/// Where items wait for their leader; open while a leader runs.
pub struct Lane<T> {
    open: Mutex<Option<mpsc::UnboundedSender<T>>>,
}

/// A leader's end of its lane.
pub struct Queue<T> {
    items: mpsc::UnboundedReceiver<T>,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Self {
            open: Mutex::new(None),
        }
    }
}

impl<T> Lane<T> {
    /// Queues `item`; with no leader at work, `start` is given the queue to lead first.
    pub fn send(&self, item: T, start: impl FnOnce(Queue<T>)) {
        let mut open = self.open.lock().expect("lane lock");
        let sender = open.get_or_insert_with(|| {
            let (sender, items) = mpsc::unbounded_channel();
            start(Queue { items });
            sender
        });
        // The leader leaves only under this lock, after seeing its queue empty.
        let _ = sender.send(item);
    }

    /// Closes the lane if nothing waits in `queue`. True: its leader leaves now.
    pub fn leave_if_dry(&self, queue: &Queue<T>) -> bool {
        let mut open = self.open.lock().expect("lane lock");
        if queue.items.is_empty() {
            *open = None;
            return true;
        }
        false
    }
}

impl<T> Queue<T> {
    /// Moves what waits into `lot`, up to `max` in all, without waiting.
    pub fn take_ready(&mut self, lot: &mut Vec<T>, max: usize) {
        while lot.len() < max {
            match self.items.try_recv() {
                Ok(item) => lot.push(item),
                Err(_) => break,
            }
        }
    }

    /// The next item, waiting for it.
    pub async fn recv(&mut self) -> Option<T> {
        self.items.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_starts_once_and_a_dry_lane_starts_another() {
        let lane: Lane<u32> = Lane::default();
        let mut queues = Vec::new();
        lane.send(1, |q| queues.push(q));
        lane.send(2, |_| panic!("a second leader while the first runs"));
        let mut queue = queues.pop().unwrap();
        let mut lot = Vec::new();
        queue.take_ready(&mut lot, 1);
        assert_eq!(lot, [1]);
        assert!(!lane.leave_if_dry(&queue), "left with an item waiting");
        queue.take_ready(&mut lot, 10);
        assert_eq!(lot, [1, 2]);
        assert!(lane.leave_if_dry(&queue));
        let mut started = false;
        lane.send(3, |_| started = true);
        assert!(started, "the lane stayed closed after its leader left");
    }
}
