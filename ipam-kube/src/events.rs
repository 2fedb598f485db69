//! Events (`events.k8s.io/v1`) on the project's objects, for what users must see where they
//! look (`kubectl describe`, `kubectl events`): an exhausted pool, a refused spec, a pool no node
//! can announce. The same happening again on the same object adds to the event's series
//! instead of making a new event.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::KubeStore;

pub struct EventPublisher {
    store: KubeStore,
    recorder: Recorder,
}

/// Warning, or a normal happening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

impl EventPublisher {
    /// Events reported by `controller` (the role), replica `instance`.
    pub fn new(store: &KubeStore, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(instance.to_owned()),
        };
        Self {
            store: store.clone(),
            recorder: Recorder::new(store.client(), reporter),
        }
    }

    /// Publishes an event on the engine's object `kind`/`name`. `reason` is CamelCase,
    /// `action` what the controller was doing, `note` the message users read.
    pub async fn publish(
        &self,
        severity: Severity,
        kind: &str,
        name: &str,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let Some(reference) = self.store.reference(kind, name).await? else {
            // Gone meanwhile: nobody to tell.
            return Ok(());
        };
        let event = Event {
            type_: match severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: reason.to_owned(),
            // The API keeps at most 1 kB of a note.
            note: Some(note.chars().take(1000).collect()),
            action: action.to_owned(),
            secondary: None,
        };
        self.recorder.publish(&event, &reference).await
    }
}

/// What an event regards: the object with its uid, as `kubectl describe` matches them.
pub(crate) fn reference_of(
    object: &kube::api::DynamicObject,
    api_version: &str,
    kind: &str,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.to_owned()),
        kind: Some(kind.to_owned()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        field_path: None,
    }
}
