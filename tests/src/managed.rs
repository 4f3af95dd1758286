//! The managed runtime as the managed suite sees it: synchronous, the same
//! names as `smolbox_tokio::Runtime` and `smolbox_blocking::Runtime` (the
//! tokio one wrapped in `block_on`). [`managed_suite!`](crate::managed_suite)
//! instantiates every case of [`crate::managed_cases`] for one shell.

use std::sync::Arc;

use smolbox_core::Error;
use smolbox_core::exec::Command;
use smolbox_core::managed::catalog::Catalog;
use smolbox_core::managed::controller::{
    Outcome, Resolution, Submission, Submit, Telemetry, WorkerEntry,
};
use smolbox_core::managed::state::MachineOperation;
use smolbox_core::managed::{
    ExecutionRecord, FingerprintKey, MachineRecord, RecordKey, RetainedMachineSpec,
};
use smolbox_core::worker::Endpoint;
use smolbox_store::Page;
use smolbox_store::Store;

/// Runtime options the cases vary.
#[derive(Clone, Debug)]
pub struct Options {
    /// Controller id (`None`: the runtime's unique default).
    pub owner: Option<String>,
    /// Claim TTL in milliseconds.
    pub lease_ttl_ms: u64,
    /// Due-scan interval in milliseconds.
    pub poll_interval_ms: u64,
    /// Most executions at once.
    pub max_active: usize,
    /// The worker also runs disposable machines (its profile is admitted).
    pub disposable: bool,
    /// The worker's catalog (C12.2), with `disposable`; `None`: an
    /// uncatalogued entry.
    pub catalog: Option<Catalog>,
    /// The artifact store declared files go through (none: specs with
    /// files are refused).
    pub artifacts: Option<Arc<smolbox_store::artifacts::MemoryArtifacts>>,
    /// With `disposable`: the machines the runtime creates get no image
    /// source (imageless machines, which refuse what needs a plain image
    /// machine).
    pub imageless: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            owner: None,
            lease_ttl_ms: 30_000,
            poll_interval_ms: 100,
            max_active: 4,
            disposable: false,
            catalog: None,
            artifacts: None,
            imageless: false,
        }
    }
}

/// Worker id the cases configure.
pub const WORKER: &str = "dev";

/// A runtime shell under test.
pub trait ManagedShell: Sized {
    /// Builds a runtime over `store` with one worker at `endpoint`.
    ///
    /// # Errors
    /// The builder's errors.
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        options: &Options,
    ) -> Result<Self, Error>;
    /// `Runtime::submit`.
    ///
    /// # Errors
    /// As the runtime's.
    fn submit(&self, submit: Submit) -> Result<Submission, Error>;
    /// `Runtime::fetch`.
    ///
    /// # Errors
    /// As the runtime's.
    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error>;
    /// `Runtime::wait`.
    ///
    /// # Errors
    /// As the runtime's.
    fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<Outcome, Error>;
    /// `Runtime::run` (submit, then wait from the acceptance).
    ///
    /// # Errors
    /// As the runtime's.
    fn run(&self, submit: Submit) -> Result<Outcome, Error>;
    /// `Runtime::cancel`.
    ///
    /// # Errors
    /// As the runtime's.
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error>;
    /// `Runtime::reconcile`.
    fn reconcile(&self);
    /// `Runtime::telemetry`.
    fn telemetry(&self) -> Vec<Telemetry>;
    /// `Runtime::shutdown`.
    fn shutdown(&self);
    /// `machines().create`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error>;
    /// `machines().list`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_list(
        &self,
        scope: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Page<MachineRecord>, Error>;
    /// `machines().inspect`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error>;
    /// `machines().wait`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<MachineRecord, Error>;
    /// `machines().start/stop/delete`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_lifecycle(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error>;
    /// `machines().submit`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error>;
    /// `machines().submit_with_files`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_submit_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error>;
    /// `machines().stop_for_drain`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_stop_for_drain(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error>;
    /// `machines().resolve`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error>;
    /// `machines().logs`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_logs(
        &self,
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> Result<Vec<String>, Error>;
    /// `machines().measurements`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error>;
    /// `Runtime::run_streamed`.
    ///
    /// # Errors
    /// As the runtime's.
    fn run_streamed(&self, submit: Submit, on_event: &mut OnEvent<'_>) -> Result<Outcome, Error>;
    /// `machines().run_streamed`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_run_streamed(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error>;
    /// `machines().run_streamed_with_files`.
    ///
    /// # Errors
    /// As the runtime's.
    fn m_run_streamed_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error>;
}

/// A streamed run's event callback.
pub type OnEvent<'a> = dyn FnMut(&smolbox_core::exec::ExecEvent) + Send + 'a;

/// A shell's runtime builder `$b` configured from the [`Options`] `$o`: the
/// worker with `$client` (for disposable machines, the profile `$admit`
/// returns, the image source unless imageless, the catalog if any), the
/// lease TTL, poll interval, capacity, owner and artifacts. A macro: the
/// two shells' builders and clients share no trait.
macro_rules! configured {
    ($b:expr, $client:expr, $o:expr, $admit:expr) => {{
        let o: &Options = $o;
        let b = $b;
        let b = if o.disposable {
            let entry = WorkerEntry::new(WORKER).with_profile($admit?);
            let entry = if o.imageless {
                entry
            } else {
                entry.with_machine_source(crate::cases::image_spec().source)
            };
            match &o.catalog {
                Some(c) => b.worker_entry(entry.with_catalog(c.clone()), $client),
                None => b.worker_entry(entry, $client),
            }
        } else {
            b.worker(WORKER, $client)
        };
        let mut b = b
            .lease_ttl_ms(o.lease_ttl_ms)
            .poll_interval_ms(o.poll_interval_ms)
            .max_active(o.max_active);
        if let Some(owner) = &o.owner {
            b = b.owner(owner);
        }
        if let Some(a) = &o.artifacts {
            b = b.artifacts(Arc::clone(a) as Arc<dyn smolbox_store::artifacts::Artifacts>);
        }
        b
    }};
}

/// `smolbox_blocking::Runtime` as a [`ManagedShell`].
#[derive(Debug)]
pub struct BlockingManaged(smolbox_blocking::Runtime);

impl ManagedShell for BlockingManaged {
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        o: &Options,
    ) -> Result<Self, Error> {
        let client = smolbox_blocking::Client::new(endpoint)?;
        let b = smolbox_blocking::Runtime::builder(store, key);
        let b = configured!(b, client, o, client.admit(&[]));
        Ok(Self(b.build()?))
    }
    fn submit(&self, submit: Submit) -> Result<Submission, Error> {
        self.0.submit(submit)
    }
    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.0.fetch(key)
    }
    fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<Outcome, Error> {
        self.0.wait(key, timeout_ms)
    }
    fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        self.0.run(submit)
    }
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.0.cancel(key)
    }
    fn reconcile(&self) {
        self.0.reconcile();
    }
    fn telemetry(&self) -> Vec<Telemetry> {
        self.0.telemetry()
    }
    fn shutdown(&self) {
        self.0.shutdown();
    }
    fn m_create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error> {
        self.0.machines().create(key, spec)
    }
    fn m_list(
        &self,
        scope: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Page<MachineRecord>, Error> {
        self.0.machines().list(scope, cursor, limit)
    }
    fn m_inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.0.machines().inspect(key)
    }
    fn m_wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<MachineRecord, Error> {
        self.0.machines().wait(key, timeout_ms)
    }
    fn m_lifecycle(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        let m = self.0.machines();
        match action {
            MachineOperation::Start => m.start(key, version),
            MachineOperation::Stop => m.stop(key, version),
            _ => m.delete(key, version),
        }
    }
    fn m_submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.0.machines().submit(machine, key, command)
    }
    fn m_submit_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.0
            .machines()
            .submit_with_files(machine, key, command, files)
    }
    fn m_stop_for_drain(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.0.machines().stop_for_drain(key, version)
    }
    fn m_resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        self.0
            .machines()
            .resolve(key, version, quiesced, disposition)
    }
    fn m_logs(
        &self,
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> Result<Vec<String>, Error> {
        self.0.machines().logs(key, params)
    }
    fn m_measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error> {
        self.0.machines().measurements(key)
    }
    fn run_streamed(&self, submit: Submit, on_event: &mut OnEvent<'_>) -> Result<Outcome, Error> {
        self.0.run_streamed(submit, on_event)
    }
    fn m_run_streamed(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error> {
        self.0
            .machines()
            .run_streamed(machine, key, command, on_event)
    }
    fn m_run_streamed_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error> {
        self.0
            .machines()
            .run_streamed_with_files(machine, key, command, files, on_event)
    }
}

/// `smolbox_tokio::Runtime` behind a synchronous face.
#[derive(Debug)]
pub struct TokioManaged {
    rt: tokio::runtime::Runtime,
    runtime: smolbox_tokio::Runtime,
}

impl ManagedShell for TokioManaged {
    fn start(
        store: Arc<dyn Store>,
        key: FingerprintKey,
        endpoint: Endpoint,
        o: &Options,
    ) -> Result<Self, Error> {
        let rt = crate::tokio_shell::runtime(2)?;
        let client = smolbox_tokio::Client::new(endpoint)?;
        let b = smolbox_tokio::Runtime::builder(store, key);
        let b = configured!(b, client, o, rt.block_on(client.admit(&[])));
        let runtime = {
            let _guard = rt.enter();
            b.build()?
        };
        Ok(Self { rt, runtime })
    }
    fn submit(&self, submit: Submit) -> Result<Submission, Error> {
        self.rt.block_on(self.runtime.submit(submit))
    }
    fn fetch(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.rt.block_on(self.runtime.fetch(key))
    }
    fn wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<Outcome, Error> {
        self.rt.block_on(self.runtime.wait(key, timeout_ms))
    }
    fn run(&self, submit: Submit) -> Result<Outcome, Error> {
        self.rt.block_on(self.runtime.run(submit))
    }
    fn cancel(&self, key: &RecordKey) -> Result<ExecutionRecord, Error> {
        self.rt.block_on(self.runtime.cancel(key))
    }
    fn reconcile(&self) {
        self.runtime.reconcile();
    }
    fn telemetry(&self) -> Vec<Telemetry> {
        self.runtime.telemetry()
    }
    fn shutdown(&self) {
        self.rt.block_on(self.runtime.shutdown());
    }
    fn m_create(
        &self,
        key: &RecordKey,
        spec: &RetainedMachineSpec,
    ) -> Result<(MachineRecord, bool), Error> {
        self.rt.block_on(self.runtime.machines().create(key, spec))
    }
    fn m_list(
        &self,
        scope: &str,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Page<MachineRecord>, Error> {
        self.rt
            .block_on(self.runtime.machines().list(scope, cursor, limit))
    }
    fn m_inspect(&self, key: &RecordKey) -> Result<MachineRecord, Error> {
        self.rt.block_on(self.runtime.machines().inspect(key))
    }
    fn m_wait(&self, key: &RecordKey, timeout_ms: u64) -> Result<MachineRecord, Error> {
        self.rt
            .block_on(self.runtime.machines().wait(key, timeout_ms))
    }
    fn m_lifecycle(
        &self,
        key: &RecordKey,
        action: MachineOperation,
        version: u64,
    ) -> Result<MachineRecord, Error> {
        let m = self.runtime.machines();
        match action {
            MachineOperation::Start => self.rt.block_on(m.start(key, version)),
            MachineOperation::Stop => self.rt.block_on(m.stop(key, version)),
            _ => self.rt.block_on(m.delete(key, version)),
        }
    }
    fn m_submit(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.rt
            .block_on(self.runtime.machines().submit(machine, key, command))
    }
    fn m_submit_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
    ) -> Result<(ExecutionRecord, Option<MachineRecord>, bool), Error> {
        self.rt.block_on(
            self.runtime
                .machines()
                .submit_with_files(machine, key, command, files),
        )
    }
    fn m_stop_for_drain(&self, key: &RecordKey, version: u64) -> Result<MachineRecord, Error> {
        self.rt
            .block_on(self.runtime.machines().stop_for_drain(key, version))
    }
    fn m_resolve(
        &self,
        key: &RecordKey,
        version: u64,
        quiesced: bool,
        disposition: Resolution,
    ) -> Result<(MachineRecord, Option<ExecutionRecord>), Error> {
        self.rt.block_on(
            self.runtime
                .machines()
                .resolve(key, version, quiesced, disposition),
        )
    }
    fn m_logs(
        &self,
        key: &RecordKey,
        params: smolbox_core::worker::LogsParams,
    ) -> Result<Vec<String>, Error> {
        self.rt.block_on(self.runtime.machines().logs(key, params))
    }
    fn m_measurements(
        &self,
        key: &RecordKey,
    ) -> Result<(smolbox_core::worker::Measurements, MachineRecord), Error> {
        self.rt.block_on(self.runtime.machines().measurements(key))
    }
    fn run_streamed(&self, submit: Submit, on_event: &mut OnEvent<'_>) -> Result<Outcome, Error> {
        self.rt
            .block_on(self.runtime.run_streamed(submit, on_event))
    }
    fn m_run_streamed(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error> {
        self.rt.block_on(
            self.runtime
                .machines()
                .run_streamed(machine, key, command, on_event),
        )
    }
    fn m_run_streamed_files(
        &self,
        machine: &RecordKey,
        key: &RecordKey,
        command: &Command,
        files: &smolbox_core::managed::CommandFiles,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Outcome, Error> {
        self.rt.block_on(
            self.runtime
                .machines()
                .run_streamed_with_files(machine, key, command, files, on_event),
        )
    }
}

/// One `#[test]` per case of `$cases` (a module of this crate whose case
/// functions take the shell as a type and the store kind) for `$shell`,
/// per store: `mod $sqlite` and `mod $postgres` (the latter needs
/// `SMOLBOX_PG_URL`). What every managed suite macro expands to.
#[doc(hidden)]
#[macro_export]
macro_rules! store_suite {
    ($shell:ty, $cases:ident, $sqlite:ident, $postgres:ident, [$($case:ident),* $(,)?]) => {
        mod $sqlite {
            $crate::store_suite!(@cases $shell, $crate::managed_cases::StoreKind::Sqlite, $cases, $($case),*);
        }
        mod $postgres {
            $crate::store_suite!(@cases $shell, $crate::managed_cases::StoreKind::Postgres, $cases, $($case),*);
        }
    };
    (@cases $shell:ty, $kind:expr, $cases:ident, $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                $crate::$cases::$case::<$shell>($kind);
            }
        )*
    };
}

/// Instantiates every managed case for `$shell` (a [`ManagedShell`]), one
/// `#[test]` per case and store, against the devworker: `mod sqlite` and
/// `mod postgres` (the latter needs `SMOLBOX_PG_URL`).
#[macro_export]
macro_rules! managed_suite {
    ($shell:ty) => {
        $crate::store_suite!(
            $shell,
            managed_cases,
            sqlite,
            postgres,
            [
                submit_returns_at_acceptance_and_wait_returns_the_outcome,
                a_buffered_command_takes_two_commits,
                a_waiter_reads_the_store_only_when_its_runtime_does_not_drive_the_key,
                a_panicking_store_op_fails_only_itself,
                a_run_past_three_claim_ttls_keeps_its_exit,
                cancel_before_dispatch_sends_nothing,
                cancel_after_dispatch_ends_the_wait_and_a_late_exit_wins,
                duplicates_resolve_to_one_exec_and_a_changed_spec_conflicts,
                an_uncertain_dispatch_is_unknown_and_never_resent,
                the_queue_deadline_expires_a_waiting_record,
                recovery_marks_a_crashed_dispatch_unknown_and_sends_nothing,
                recovery_dispatches_a_ready_record_once_from_its_stored_spec,
                a_live_claim_of_another_controller_is_respected,
                sentinels_never_reach_the_database_files,
                a_disposable_machine_is_created_used_deleted_and_released,
                a_spec_outside_the_workers_catalog_is_refused_before_anything_is_stored,
                a_create_the_worker_refuses_fails_and_releases_the_reservation,
                two_runtimes_on_one_store_dispatch_each_command_once,
            ]
        );
    };
}
