//! The image-machine preflight (features C5.4, C6.1, C7.4; worker-api.md
//! §8.5): an operation that needs a plain image machine inspects it first,
//! inside its own operation deadline, and sends nothing when it is not one.

use super::name::MachineName;
use super::observation::Observation;
use super::ops::Get;
use crate::Evidence;
use crate::error::{Error, Operation};
use crate::worker::profile::Profile;

/// The inspect an operation needs before it is sent, and the verdict on
/// its result. Core decides *whether* an operation carries one (an
/// extended command, a terminal, a large or out-of-root file: see
/// [`crate::worker::WorkerCall::image_check`]); a shell only performs
/// [`Self::inspect`] with the operation's deadlines and hands the result to
/// [`Self::admit`] before it sends the operation itself.
#[derive(Clone, Debug)]
pub struct ImageCheck {
    get: Get,
    operation: Operation,
}

impl ImageCheck {
    /// The preflight of `operation` on `machine`, against a worker with
    /// `profile` (already admitted by the health preflight).
    ///
    /// # Errors
    /// `validation` (`invalid_machine_name`), evidence `not_dispatched`,
    /// attributed to `operation`.
    pub fn new(profile: &Profile, machine: &str, operation: Operation) -> Result<Self, Error> {
        let name = MachineName::new(machine).map_err(|e| e.with_operation(operation))?;
        Ok(Self {
            get: Get::new(profile, name),
            operation,
        })
    }

    /// The inspect to perform (`GET /api/v1/machines/{name}`), within the
    /// gated operation's deadlines.
    pub fn inspect(&self) -> &Get {
        &self.get
    }

    /// The gated operation.
    pub const fn operation(&self) -> Operation {
        self.operation
    }

    /// The verdict on the inspect's result: `Ok` for a plain image machine
    /// (non-empty `image`, `branchable == false`), so the gated operation
    /// may be sent.
    ///
    /// # Errors
    /// Every refusal carries evidence `not_dispatched`: the gated request
    /// was never sent (the inspect itself does not mutate).
    /// * the inspect's own error (transport, `not_found`, `protocol`,
    ///   `expired`, …), its category, reason and operation (`get`) kept;
    /// * `unsupported_capability` (`needs_plain_image_machine`) on the
    ///   gated operation for an imageless, checkpoint or branchable machine.
    pub fn admit(&self, inspected: Result<Observation, Error>) -> Result<(), Error> {
        inspected
            .map_err(|e| e.with_evidence(Evidence::NotDispatched))?
            .require_plain_image_machine(self.operation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Version;
    use crate::{Category, Reason};

    fn observation(image: Option<&str>, branchable: Option<bool>) -> Observation {
        let mut json = String::from(
            r#"{"name":"m1","state":"running","cpus":1,"memoryMb":256,"storageGb":1,"overlayGb":1,"mounts":[],"ports":[],"network":false,"gpu":false,"cuda":false,"createdAt":1"#,
        );
        if let Some(i) = image {
            json.push_str(&format!(r#","image":"{i}""#));
        }
        if let Some(b) = branchable {
            json.push_str(&format!(r#","branchable":{b},"forkable":{b}"#));
        }
        json.push('}');
        let profile = Profile::known(Version::V1_22_0);
        super::super::observation::decode_observation(&profile, Operation::Get, json.as_bytes())
            .expect("valid machine json")
    }

    fn check() -> ImageCheck {
        ImageCheck::new(
            &Profile::known(Version::V1_22_0),
            "m1",
            Operation::TerminalOpen,
        )
        .unwrap()
    }

    #[test]
    fn a_plain_image_machine_is_admitted() {
        assert!(
            check()
                .admit(Ok(observation(Some("alpine:3"), Some(false))))
                .is_ok()
        );
    }

    #[test]
    fn imageless_branchable_or_unreported_machines_are_refused_unsent() {
        for obs in [
            observation(None, Some(false)),
            observation(Some(""), Some(false)),
            observation(Some("alpine:3"), Some(true)),
            observation(Some("alpine:3"), None),
        ] {
            let e = check().admit(Ok(obs)).unwrap_err();
            assert_eq!(e.category(), Category::UnsupportedCapability);
            assert_eq!(e.reason(), Reason::NeedsPlainImageMachine);
            assert_eq!(e.operation(), Operation::TerminalOpen);
            assert_eq!(e.evidence(), Evidence::NotDispatched);
        }
    }

    #[test]
    fn an_inspect_failure_is_not_dispatched_for_the_gated_operation() {
        let failed = Error::not_found(
            Operation::Get,
            Evidence::DispatchUncertain,
            Reason::MachineNotFound,
        );
        let e = check().admit(Err(failed)).unwrap_err();
        assert_eq!(e.category(), Category::NotFound);
        assert_eq!(e.operation(), Operation::Get);
        assert_eq!(e.evidence(), Evidence::NotDispatched);
    }

    #[test]
    fn a_bad_machine_name_is_refused_on_the_gated_operation() {
        let e = ImageCheck::new(
            &Profile::known(Version::V1_22_0),
            "Bad/Name",
            Operation::Exec,
        )
        .unwrap_err();
        assert_eq!(e.category(), Category::Validation);
        assert_eq!(e.operation(), Operation::Exec);
        assert_eq!(e.evidence(), Evidence::NotDispatched);
    }
}
