//! The engine's frame: one [`session`] runs every job on its thread and queues what the jobs
//! report ([`events`]); training can run in a child process ([`worker`]) so a driver crash ends
//! only that process; every failure is an [`error::Error`] that names what is at fault and the
//! fix; messages say counts one way ([`words`]). The CLI, the app, the worker process and the browser pages are clients of a session.

pub mod error;
pub mod events;
pub mod session;
pub mod words;
pub mod worker;
