//! The blocking runtime's worker-op threads. An op runs on a thread kept
//! idle by an earlier op when there is one, else on a new thread (ops may
//! block for as long as their command runs, so each op has a thread of its
//! own while it runs, as before). At most [`MAX_IDLE`] threads wait for
//! the next op; the rest end after their op. Every idle thread ends when
//! the driver drops the pool. A thread is registered as idle before it
//! sends its answer, so the op that answer leads to finds it.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Idle worker-op threads kept for the next op.
pub(super) const MAX_IDLE: usize = 8;

/// One op: runs on a worker-op thread; its value goes to the answers.
pub(super) type Job<T> = Box<dyn FnOnce() -> T + Send>;

/// What a thread receives: the op, and the sender of the thread's own
/// queue, which it hands back to the pool once idle (an idle thread holds
/// no sender of its queue, so dropping the pool ends it).
struct Task<T> {
    job: Job<T>,
    me: mpsc::Sender<Self>,
}

type Idle<T> = Mutex<Vec<mpsc::Sender<Task<T>>>>;

/// The driver's worker-op threads (one pool per runtime).
pub(super) struct WorkerThreads<T> {
    idle: Arc<Idle<T>>,
    answers: mpsc::Sender<T>,
    /// Threads started so far.
    spawned: usize,
}

impl<T: Send + 'static> WorkerThreads<T> {
    /// No thread yet; answers go to `answers`.
    pub(super) fn new(answers: mpsc::Sender<T>) -> Self {
        Self {
            idle: Arc::new(Mutex::new(Vec::new())),
            answers,
            spawned: 0,
        }
    }

    /// Runs `job` on an idle thread, else on a new one.
    ///
    /// # Errors
    /// The thread could not be started (the job never ran).
    pub(super) fn run(&mut self, mut job: Job<T>) -> std::io::Result<()> {
        loop {
            let Some(thread) = self.pop_idle() else { break };
            let task = Task {
                job,
                me: thread.clone(),
            };
            match thread.send(task) {
                Ok(()) => return Ok(()),
                // That thread is gone (its op panicked, or it ended after
                // registering): the job did not run; try the next one.
                Err(mpsc::SendError(task)) => job = task.job,
            }
        }
        let (me, queue) = mpsc::channel();
        let first = Task { job, me };
        let idle = Arc::downgrade(&self.idle);
        let answers = self.answers.clone();
        std::thread::Builder::new()
            .name("smolbox-worker-op".into())
            .spawn(move || serve(first, &queue, &idle, &answers))?;
        self.spawned += 1;
        Ok(())
    }

    fn pop_idle(&self) -> Option<mpsc::Sender<Task<T>>> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    /// Threads started so far (tests).
    #[cfg(test)]
    fn spawned(&self) -> usize {
        self.spawned
    }

    /// Threads waiting for an op (tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A worker-op thread: runs its task, registers as idle (while the pool
/// lives and keeps fewer than [`MAX_IDLE`]), answers, and waits for the
/// next task; ends when not kept or when its queue has no sender left.
fn serve<T>(
    mut task: Task<T>,
    queue: &mpsc::Receiver<Task<T>>,
    idle: &Weak<Idle<T>>,
    answers: &mpsc::Sender<T>,
) {
    loop {
        let Task { job, me } = task;
        let answer = job();
        let kept = idle.upgrade().is_some_and(|idle| {
            let mut idle = idle.lock().unwrap_or_else(PoisonError::into_inner);
            let room = idle.len() < MAX_IDLE;
            if room {
                idle.push(me);
            }
            room
        });
        if answers.send(answer).is_err() || !kept {
            return;
        }
        match queue.recv() {
            Ok(next) => task = next,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use std::sync::Barrier;

    #[test]
    fn ops_one_after_another_reuse_one_thread() {
        let (tx, rx) = mpsc::channel();
        let mut pool = WorkerThreads::new(tx);
        for i in 0..20_usize {
            pool.run(Box::new(move || i * 2)).unwrap();
            assert_eq!(rx.recv().unwrap(), i * 2);
        }
        assert_eq!(pool.spawned(), 1);
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn concurrent_ops_each_get_a_thread_and_at_most_max_idle_stay() {
        for (running, kept) in [(MAX_IDLE, MAX_IDLE), (MAX_IDLE + 1, MAX_IDLE)] {
            let (tx, rx) = mpsc::channel();
            let mut pool = WorkerThreads::new(tx);
            // Every op waits until all of them run: each needs its own thread.
            let all = Arc::new(Barrier::new(running));
            for i in 0..running {
                let all = Arc::clone(&all);
                pool.run(Box::new(move || {
                    all.wait();
                    i
                }))
                .unwrap();
            }
            let mut got: Vec<usize> = (0..running).map(|_| rx.recv().unwrap()).collect();
            got.sort_unstable();
            assert_eq!(got, (0..running).collect::<Vec<_>>());
            assert_eq!(pool.spawned(), running);
            assert_eq!(pool.idle(), kept, "{running} ran");
            // The kept threads take the next ops: no new thread.
            for i in 0..kept {
                pool.run(Box::new(move || i)).unwrap();
                rx.recv().unwrap();
            }
            assert_eq!(pool.spawned(), running);
        }
    }

    #[test]
    fn a_gone_thread_is_skipped_and_the_op_still_runs() {
        let (tx, rx) = mpsc::channel();
        let mut pool = WorkerThreads::<usize>::new(tx);
        // A sender whose thread is gone, as if its last op had panicked
        // after registering.
        let (dead, queue) = mpsc::channel();
        drop(queue);
        pool.idle.lock().unwrap().push(dead);
        pool.run(Box::new(|| 7)).unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
        assert_eq!(pool.spawned(), 1);
    }

    #[test]
    fn dropping_the_pool_ends_its_idle_threads() {
        let (tx, rx) = mpsc::channel();
        let mut pool = WorkerThreads::new(tx);
        let all = Arc::new(Barrier::new(3));
        for _ in 0..3 {
            let all = Arc::clone(&all);
            pool.run(Box::new(move || {
                all.wait();
            }))
            .unwrap();
        }
        for _ in 0..3 {
            rx.recv().unwrap();
        }
        assert_eq!(pool.idle(), 3);
        drop(pool);
        // Each thread holds a sender of the answers: the channel
        // disconnects only once every one of them has ended.
        assert!(rx.recv().is_err());
    }
}
