use super::*;

fn step(step: usize) -> Report {
    Report::Event(Event::Step {
        step,
        epoch: 0,
        loss: 1.0,
        accuracy: 0.5,
        lr: 1e-3,
        images_per_sec: 1.0,
        data_wait_secs: 0.0,
    })
}

#[test]
fn a_full_queue_replaces_the_oldest_sample_and_keeps_every_state_change() {
    let q = ReportQueue::default();
    q.push(Report::Event(Event::Warning("first".into())));
    for s in 1..=QUEUE_CAPACITY + 10 {
        q.push(step(s));
    }
    q.push(Report::Event(Event::Checkpoint { path: "c".into() }));
    q.push(Report::Finished { kind: JobKind::Export, result: Ok(JobOutput::Exported(vec![])) });
    let mut steps = Vec::new();
    let (mut warnings, mut checkpoints, mut finished) = (0, 0, 0);
    while let Some(r) = q.try_pop() {
        match r {
            Report::Event(Event::Step { step, .. }) => steps.push(step),
            Report::Event(Event::Warning(_)) => warnings += 1,
            Report::Event(Event::Checkpoint { .. }) => checkpoints += 1,
            Report::Finished { .. } => finished += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((warnings, checkpoints, finished), (1, 1, 1), "no state change is dropped");
    assert_eq!(steps.len(), QUEUE_CAPACITY - 1, "the queue stays at its capacity");
    assert_eq!(*steps.last().unwrap(), QUEUE_CAPACITY + 10, "the newest sample is kept");
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "samples stay in order");
}

#[test]
fn a_failing_job_ends_with_its_error_and_the_session_runs_the_next_job() {
    let session = Session::start(|| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Exporting a run that does not exist is an error, not a panic; the session lives on.
    let export = || Job::Export {
        run: dir.path().join("none"),
        dir: dir.path().join("x"),
        options: crate::export::ExportOptions::default(),
    };
    assert!(session.run(export(), &mut |_| {}).is_err());
    let again = session.run(export(), &mut |_| {});
    assert!(again.unwrap_err().to_string().contains("none"));
    assert!(!session.busy());
}
