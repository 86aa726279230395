//! Dynamic MIG in the plugin (docs/mig.md, "Prepare"): a claim's dynamic MIG devices are
//! created before it is answered and destroyed when it is unprepared, each step recorded in
//! the checkpoint ([`MigRecord`]) before it is taken, so that a restart anywhere leaves no
//! instance leaked and destroys none it should not ([`Plugin::reconcile_mig`]).
//!
//! Order of a prepare: the intent (`creating`) saved → the create asked for and awaited (the
//! lock released) → the instance recorded (`created`) and saved → the claim's spec written and
//! the claim recorded. Of an unprepare: every record of the claim marked `destroying` and
//! saved → each destroy asked for → its record dropped and saved → the spec and claim removed.

use std::collections::BTreeMap;

use super::{checkpoint, ClaimError, Plugin};
use crate::dra::checkpoint::{Checkpoint, MigInstance, MigRecord, MigRecordState};
use crate::dra::mig::MigCallError;
use crate::dra::prepare::{self, ClaimRef, DynamicPick, PreparedDevice};
use crate::dra::DraInput;
use crate::inventory::{Inventory, MigDevice};

impl Plugin {
    /// Records and saves an intent (`creating`) for each of `picks` the claim does not hold
    /// already (an instance created for it by an earlier, failed prepare, or adopted at start,
    /// is used again); the picks left to create.
    ///
    /// # Errors
    /// [`ClaimError::InProgress`] while another call creates or destroys the claim's devices;
    /// [`ClaimError::MigCreate`] without a hardware path; a failed save.
    pub(super) fn record_intents(
        &self,
        state: &mut Checkpoint,
        c: &ClaimRef,
        picks: &[DynamicPick],
    ) -> Result<Vec<DynamicPick>, ClaimError> {
        let mine: Vec<&MigRecord> = state
            .dynamic_mig
            .iter()
            .filter(|r| r.claim.uid == c.uid)
            .collect();
        if mine.iter().any(|r| r.state != MigRecordState::Created) {
            return Err(ClaimError::InProgress {
                claim: c.to_string(),
            });
        }
        let to_create: Vec<DynamicPick> = picks
            .iter()
            .filter(|p| {
                !mine.iter().any(|r| {
                    r.device == p.device && r.gpu_uuid == p.gpu_uuid && r.start == p.placement.start
                })
            })
            .cloned()
            .collect();
        if let (Some(p), None) = (to_create.first(), &self.mig) {
            return Err(ClaimError::MigCreate {
                claim: c.to_string(),
                device: p.device.clone(),
                source: Box::new(MigCallError::NoHardware),
            });
        }
        let before = state.dynamic_mig.len();
        state
            .dynamic_mig
            .extend(to_create.iter().map(|p| intent(c, p)));
        if !to_create.is_empty() {
            if let Err(source) = checkpoint::save(&self.checkpoint_path, state) {
                state.dynamic_mig.truncate(before);
                return Err(ClaimError::Checkpoint {
                    claim: c.to_string(),
                    source,
                });
            }
            self.publish_prepared(state);
        }
        Ok(to_create)
    }

    /// Asks for `p`'s instance and records the answer: `created` with its ids and UUID, or, on
    /// a failure, the intent removed.
    ///
    /// # Errors
    /// [`ClaimError::MigCreate`] with the driver's reason; a failed save of the instance (the
    /// file still says `creating`: a restart adopts the instance).
    pub(super) async fn create_one(&self, c: &ClaimRef, p: &DynamicPick) -> Result<(), ClaimError> {
        let result = match &self.mig {
            Some(mig) => mig.create(&p.gpu_uuid, &p.profile, p.placement.start).await,
            None => Err(MigCallError::NoHardware),
        };
        let mut state = self.lock();
        let is_it = |r: &MigRecord| {
            r.claim.uid == c.uid && r.device == p.device && r.state == MigRecordState::Creating
        };
        let created = match result {
            Ok(created) => created,
            Err(source) => {
                state.dynamic_mig.retain(|r| !is_it(r));
                if let Err(e) = checkpoint::save(&self.checkpoint_path, &state) {
                    tracing::warn!(claim = %c, error = %crate::errors::chain(&e), "DRA: the failed create's intent could not be removed from the file (a restart drops it)");
                }
                self.publish_prepared(&state);
                return Err(ClaimError::MigCreate {
                    claim: c.to_string(),
                    device: p.device.clone(),
                    source: Box::new(source),
                });
            }
        };
        if let Some(r) = state.dynamic_mig.iter_mut().find(|r| is_it(r)) {
            r.state = MigRecordState::Created;
            r.instance = Some(instance_of(&created.device));
        }
        tracing::info!(claim = %c, device = %p.device, mig = %created.device.uuid, "DRA: MIG device created for the claim");
        checkpoint::save(&self.checkpoint_path, &state).map_err(|source| ClaimError::Checkpoint {
            claim: c.to_string(),
            source,
        })
    }

    /// The claim prepared once its dynamic MIG devices exist: staged again against what the
    /// other claims hold now (the lock was released meanwhile), each dynamic device given its
    /// instance's UUID, committed.
    ///
    /// # Errors
    /// What [`prepare::stage`] refuses now; the spec or checkpoint write.
    pub(super) fn commit_dynamic(
        &self,
        c: &ClaimRef,
        claim: &k8s_openapi::api::resource::v1::ResourceClaim,
        input: &DraInput,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let mut state = self.lock();
        if let Some(p) = state.claims.get(&c.uid).filter(|p| !p.rebuilt) {
            return Ok(p.devices.clone());
        }
        let held = state.held(&c.uid);
        let staged = prepare::stage(claim, c, &self.context(input), &held)?;
        let created: BTreeMap<String, String> = state
            .dynamic_mig
            .iter()
            .filter(|r| r.claim.uid == c.uid && r.state == MigRecordState::Created)
            .filter_map(|r| Some((r.device.clone(), r.instance.as_ref()?.uuid.clone())))
            .collect();
        let prepared = staged.finish(&created);
        self.commit(&mut state, c, prepared)
    }

    /// Destroys claim `c`'s dynamic MIG devices: every record marked `destroying` and saved,
    /// then each destroyed and dropped. Nothing to do for a claim without records.
    ///
    /// # Errors
    /// [`ClaimError::InProgress`] while the claim's devices are being created;
    /// [`ClaimError::MigDestroy`] with the driver's reason (the record stays `destroying`, so
    /// the kubelet's retry destroys it); a failed save.
    pub(super) async fn destroy_dynamic(&self, c: &ClaimRef) -> Result<(), ClaimError> {
        let targets = {
            let mut state = self.lock();
            if state
                .dynamic_mig
                .iter()
                .any(|r| r.claim.uid == c.uid && r.state == MigRecordState::Creating)
            {
                return Err(ClaimError::InProgress {
                    claim: c.to_string(),
                });
            }
            let mut changed = false;
            for r in state
                .dynamic_mig
                .iter_mut()
                .filter(|r| r.claim.uid == c.uid)
            {
                changed |= r.state != MigRecordState::Destroying;
                r.state = MigRecordState::Destroying;
            }
            if changed {
                checkpoint::save(&self.checkpoint_path, &state).map_err(|source| {
                    ClaimError::Checkpoint {
                        claim: c.to_string(),
                        source,
                    }
                })?;
            }
            let mine: Vec<MigRecord> = state
                .dynamic_mig
                .iter()
                .filter(|r| r.claim.uid == c.uid)
                .cloned()
                .collect();
            mine
        };
        for r in &targets {
            self.destroy_record(r)
                .await
                .map_err(|source| ClaimError::MigDestroy {
                    claim: c.to_string(),
                    device: r.device.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// Destroys record `r`'s instance (none recorded: nothing to destroy) and drops the record.
    ///
    /// # Errors
    /// The driver's reason, or no hardware path; the record stays.
    async fn destroy_record(&self, r: &MigRecord) -> Result<(), MigCallError> {
        if let Some(i) = &r.instance {
            let mig = self.mig.as_ref().ok_or(MigCallError::NoHardware)?;
            mig.destroy(&r.gpu_uuid, i.gi_id, i.ci_id).await?;
            tracing::info!(claim = %r.claim, device = %r.device, mig = %i.uuid, "DRA: MIG device destroyed");
        }
        let mut state = self.lock();
        state
            .dynamic_mig
            .retain(|x| !(x.claim.uid == r.claim.uid && x.device == r.device));
        if let Err(e) = checkpoint::save(&self.checkpoint_path, &state) {
            tracing::warn!(claim = %r.claim, error = %crate::errors::chain(&e), "DRA: a destroyed MIG device's record could not be dropped from the file (a restart finds the instance gone and drops it)");
        }
        self.publish_prepared(&state);
        Ok(())
    }

    /// At start, before the plugin serves: the checkpoint's dynamic MIG records reconciled
    /// with a discovery made after every request queued before it ([`reconcile`]); the
    /// records to destroy are destroyed (one that fails stays `destroying`, for the next start
    /// or the claim's unprepare). Without records nothing is asked; without an answer (no
    /// hardware, a failed discovery) the records stay as they are and hold their placements.
    pub async fn reconcile_mig(&self) {
        {
            let state = self.lock();
            if state.dynamic_mig.is_empty() && !rebuilt_dynamic(&state) {
                return;
            }
        }
        let answer = match &self.mig {
            Some(mig) => mig.inventory().await,
            None => Err(MigCallError::NoHardware),
        };
        let inventory = match answer {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(error = %crate::errors::chain(&e), "DRA: the dynamic MIG records cannot be checked against the GPUs; kept as they are");
                return;
            }
        };
        let to_destroy = {
            let mut state = self.lock();
            adopt_rebuilt(&mut state, &inventory);
            let to_destroy = reconcile(&mut state, &inventory);
            if let Err(e) = checkpoint::save(&self.checkpoint_path, &state) {
                tracing::warn!(error = %crate::errors::chain(&e), "DRA: the reconciled dynamic MIG records could not be saved");
            }
            self.publish_prepared(&state);
            to_destroy
        };
        for r in &to_destroy {
            if let Err(e) = self.destroy_record(r).await {
                tracing::warn!(claim = %r.claim, device = %r.device, error = %crate::errors::chain(&e), "DRA: a MIG device left by an earlier run could not be destroyed; kept for the next try");
            }
        }
    }
}

/// The intent record of `p` for claim `c`.
fn intent(c: &ClaimRef, p: &DynamicPick) -> MigRecord {
    MigRecord {
        claim: c.clone(),
        device: p.device.clone(),
        gpu_uuid: p.gpu_uuid.clone(),
        profile: p.profile.clone(),
        start: p.placement.start,
        size: p.placement.size,
        state: MigRecordState::Creating,
        instance: None,
    }
}

/// What a record keeps of a created MIG device.
fn instance_of(m: &MigDevice) -> MigInstance {
    MigInstance {
        gi_id: m.gi_id,
        ci_id: m.ci_id,
        uuid: m.uuid.clone(),
    }
}

/// The MIG device at record `r`'s place in `inventory`: on its GPU, at its placement's start,
/// of its profile.
fn instance_at<'a>(inventory: &'a Inventory, r: &MigRecord) -> Option<&'a MigDevice> {
    inventory
        .by_uuid(&r.gpu_uuid)?
        .mig_devices
        .iter()
        .find(|m| m.profile == r.profile && m.placement.is_some_and(|p| p.start == r.start))
}

/// Whether a claim rebuilt from the API (the checkpoint was lost) holds a device named like a
/// dynamic MIG device, which [`adopt_rebuilt`] may need the GPUs for.
fn rebuilt_dynamic(state: &Checkpoint) -> bool {
    state
        .claims
        .values()
        .filter(|p| p.rebuilt)
        .flat_map(|p| &p.devices)
        .any(|d| d.device.starts_with("gpu-") && d.device.contains("-mig-"))
}

/// Records for the dynamic MIG devices of claims rebuilt from the API after the checkpoint
/// was lost (pure): a rebuilt claim's device that names a dynamic placement
/// ([`crate::plan::dra_names::parse_dynamic_mig`]) holding an instance of its profile was
/// created for that claim before the file went. It is recorded `created` with that instance
/// (so the daemon keeps it off the static MIG devices and the claim's unprepare destroys it),
/// and the claim's device gets the instance's UUID. A placement with no instance, or one a
/// record names already, gets none (the kubelet's next prepare of the claim creates it).
/// Returns how many were recorded.
pub fn adopt_rebuilt(state: &mut Checkpoint, inventory: &Inventory) -> usize {
    let mut adopted = 0;
    let Checkpoint {
        claims,
        dynamic_mig,
        ..
    } = state;
    for p in claims.values_mut().filter(|p| p.rebuilt) {
        for d in &mut p.devices {
            let Some(dynamic) = crate::plan::dra_names::parse_dynamic_mig(&d.device, inventory)
            else {
                continue;
            };
            let mut record = MigRecord {
                claim: p.claim.clone(),
                device: d.device.clone(),
                gpu_uuid: dynamic.gpu_uuid,
                profile: dynamic.profile,
                start: dynamic.placement.start,
                size: dynamic.placement.size,
                state: MigRecordState::Created,
                instance: None,
            };
            let taken = dynamic_mig
                .iter()
                .any(|r| r.gpu_uuid == record.gpu_uuid && r.start == record.start);
            let Some(m) = instance_at(inventory, &record).filter(|_| !taken) else {
                continue;
            };
            tracing::warn!(claim = %p.claim, device = %d.device, mig = %m.uuid, "DRA: a MIG device of a claim rebuilt from the API (the checkpoint was lost) recorded as created for it");
            record.instance = Some(instance_of(m));
            d.id.clone_from(&m.uuid);
            dynamic_mig.push(record);
            adopted += 1;
        }
    }
    adopted
}

/// The checkpoint's dynamic MIG records after a restart, against `inventory` (pure): a
/// `creating` record whose placement holds an instance of its profile adopts it (`created`;
/// its claim's retried prepare uses it, its unprepare destroys it); one without is dropped (the
/// create never happened). A `created` record of a claim the checkpoint has prepared stays. A
/// `created` record of a claim not prepared (the answer never reached the file, or an
/// instance adopted at an earlier start whose claim never came back) and a `destroying` one
/// are marked `destroying` and returned, to destroy, when the instance they name (by UUID) is
/// still there, and dropped when it is gone. Instances no record names are never looked at.
pub fn reconcile(state: &mut Checkpoint, inventory: &Inventory) -> Vec<MigRecord> {
    let mut destroy = Vec::new();
    let claims = &state.claims;
    state.dynamic_mig.retain_mut(|r| {
        let found = instance_at(inventory, r);
        match r.state {
            MigRecordState::Creating => match found {
                Some(m) => {
                    tracing::info!(claim = %r.claim, device = %r.device, mig = %m.uuid, "DRA: a MIG device created before a restart adopted by its claim");
                    r.state = MigRecordState::Created;
                    r.instance = Some(instance_of(m));
                    true
                }
                None => false,
            },
            MigRecordState::Created if claims.contains_key(&r.claim.uid) => true,
            MigRecordState::Created | MigRecordState::Destroying => {
                let named = r.instance.as_ref().map(|i| i.uuid.as_str());
                if found.is_some_and(|m| Some(m.uuid.as_str()) == named) {
                    r.state = MigRecordState::Destroying;
                    destroy.push(r.clone());
                    true
                } else {
                    false
                }
            }
        }
    });
    destroy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::MigPlacement;

    fn node() -> Inventory {
        let text = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 0\n        - profile: 1g.10gb\n          placementStart: 4\n        - profile: 1g.10gb\n          placementStart: 5\n";
        crate::inventory::simulated::parse(std::path::Path::new("n.yaml"), text).unwrap()
    }

    fn record(uid: &str, profile: &str, start: u32, state: MigRecordState) -> MigRecord {
        MigRecord {
            claim: ClaimRef {
                namespace: "ns".into(),
                name: format!("c-{uid}"),
                uid: uid.into(),
            },
            device: format!("gpu-0-mig-{}-{start}", profile.replace('.', "-")),
            gpu_uuid: node().gpus[0].uuid.clone(),
            profile: profile.into(),
            start,
            size: MigPlacement { start, size: 1 }.size,
            state,
            instance: None,
        }
    }

    fn with_instance(mut r: MigRecord, inv: &Inventory, start: u32) -> MigRecord {
        let m = inv.gpus[0]
            .mig_devices
            .iter()
            .find(|m| m.placement.is_some_and(|p| p.start == start))
            .unwrap();
        r.instance = Some(instance_of(m));
        r
    }

    /// A claim rebuilt from the API (the checkpoint lost) whose dynamic device's placement
    /// holds an instance of its profile gets a `created` record for it and the instance's UUID;
    /// a device whose placement is empty, one a record names already, a device of another form
    /// and a claim that was not rebuilt get none. A restart after that keeps the record (its
    /// claim is prepared), so the instance is neither destroyed nor planned as a static device.
    #[test]
    fn a_rebuilt_claims_dynamic_devices_are_recorded_with_their_instances() {
        let inv = node();
        let device = |name: &str| PreparedDevice {
            requests: vec!["mig".into()],
            pool: "node-1".into(),
            device: name.into(),
            cdi_ids: Vec::new(),
            resource: String::new(),
            id: String::new(),
            share: None,
        };
        let claim =
            |uid: &str, rebuilt: bool, devices: &[&str]| crate::dra::prepare::PreparedClaim {
                claim: record(uid, "1g.10gb", 4, MigRecordState::Created).claim,
                pods: Vec::new(),
                devices: devices.iter().map(|d| device(d)).collect(),
                spec_file: String::new(),
                spec: serde_json::Value::Null,
                rebuilt,
            };
        let mut state = Checkpoint::new();
        // 3g.40gb@0 and 1g.10gb@4 exist; 1g.10gb@6 does not; 1g.10gb@5 exists but a record
        // names it.
        state.claims.insert(
            "u1".into(),
            claim(
                "u1",
                true,
                &["gpu-0-mig-3g-40gb-0", "gpu-0-mig-1g-10gb-6", "gpu-abc-r1"],
            ),
        );
        state
            .claims
            .insert("u2".into(), claim("u2", false, &["gpu-0-mig-1g-10gb-4"]));
        state
            .claims
            .insert("u3".into(), claim("u3", true, &["gpu-0-mig-1g-10gb-5"]));
        // The GPUs are asked only for a rebuilt claim with a device named like a dynamic one.
        let only = |uid: &str, rebuilt: bool, devices: &[&str]| {
            let mut c = Checkpoint::new();
            c.claims.insert(uid.into(), claim(uid, rebuilt, devices));
            rebuilt_dynamic(&c)
        };
        assert!(!only("u5", true, &["gpu-abc-r1", "mig-abc"]));
        assert!(!only("u5", false, &["gpu-0-mig-1g-10gb-4"]));
        assert!(only("u5", true, &["gpu-0-mig-1g-10gb-4"]));
        let held = with_instance(record("u9", "1g.10gb", 5, MigRecordState::Created), &inv, 5);
        state.dynamic_mig = vec![held.clone()];
        assert!(rebuilt_dynamic(&state));
        assert_eq!(adopt_rebuilt(&mut state, &inv), 1);
        let made = &inv.gpus[0].mig_devices[0];
        assert_eq!(state.dynamic_mig.len(), 2);
        let r = &state.dynamic_mig[1];
        assert_eq!(
            (
                r.claim.uid.as_str(),
                r.device.as_str(),
                r.start,
                r.size,
                r.state
            ),
            ("u1", "gpu-0-mig-3g-40gb-0", 0, 4, MigRecordState::Created)
        );
        assert_eq!(
            r.instance.as_ref().map(|i| i.uuid.as_str()),
            Some(made.uuid.as_str())
        );
        assert_eq!(state.claims["u1"].devices[0].id, made.uuid);
        assert_eq!(
            state.claims["u1"].devices[1].id, "",
            "no instance at slice 6"
        );
        assert_eq!(state.claims["u2"].devices[0].id, "", "not rebuilt");
        assert_eq!(
            state.claims["u3"].devices[0].id, "",
            "slice 5 is recorded for u9"
        );
        assert_eq!(adopt_rebuilt(&mut state, &inv), 0, "recorded once");
        let destroy = reconcile(&mut state, &inv);
        assert!(
            destroy.iter().all(|r| r.claim.uid != "u1"),
            "the adopted instance is not destroyed: {destroy:?}"
        );
        assert!(state.dynamic_mig.iter().any(|r| r.claim.uid == "u1"));
    }

    /// A restart between create and answer adopts the instance; an intent whose create never
    /// happened is dropped; a `destroying` record is returned once to destroy and one whose
    /// instance is gone is dropped; a claim's `created` record stays while the claim is
    /// prepared and is destroyed when it is not; the instance at slice 5 no record names is
    /// never returned.
    #[test]
    fn a_restart_adopts_drops_and_destroys_by_record_only() {
        use MigRecordState::{Created, Creating, Destroying};
        let inv = node();
        let mut state = Checkpoint::new();
        let prepared = crate::dra::prepare::PreparedClaim {
            claim: record("u3", "1g.10gb", 4, Created).claim,
            pods: Vec::new(),
            devices: Vec::new(),
            spec_file: String::new(),
            spec: serde_json::Value::Null,
            rebuilt: false,
        };
        state.claims.insert("u3".into(), prepared);
        state.dynamic_mig = vec![
            record("u1", "3g.40gb", 0, Creating),
            record("u2", "1g.10gb", 1, Creating),
            with_instance(record("u3", "1g.10gb", 4, Created), &inv, 4),
            with_instance(record("u4", "1g.10gb", 4, Destroying), &inv, 4),
            {
                let mut gone = record("u5", "1g.10gb", 6, Destroying);
                gone.instance = Some(MigInstance {
                    gi_id: 9,
                    ci_id: 0,
                    uuid: "MIG-gone".into(),
                });
                gone
            },
        ];
        let destroy = reconcile(&mut state, &inv);
        let adopted = &state.dynamic_mig[0];
        assert_eq!((adopted.claim.uid.as_str(), adopted.state), ("u1", Created));
        assert_eq!(
            adopted.instance.as_ref().map(|i| i.uuid.as_str()),
            Some(inv.gpus[0].mig_devices[0].uuid.as_str())
        );
        let kept: Vec<(&str, MigRecordState)> = state
            .dynamic_mig
            .iter()
            .map(|r| (r.claim.uid.as_str(), r.state))
            .collect();
        assert_eq!(
            kept,
            vec![("u1", Created), ("u3", Created), ("u4", Destroying)]
        );
        let destroyed: Vec<&str> = destroy.iter().map(|r| r.claim.uid.as_str()).collect();
        assert_eq!(destroyed, vec!["u4"]);
        // A second start (the claim of the adopted one never came back) destroys it then.
        state.dynamic_mig.retain(|r| r.claim.uid != "u4");
        let destroy = reconcile(&mut state, &inv);
        let destroyed: Vec<&str> = destroy.iter().map(|r| r.claim.uid.as_str()).collect();
        assert_eq!(destroyed, vec!["u1"]);
        assert!(destroy
            .iter()
            .all(|r| r.instance.as_ref().unwrap().uuid != inv.gpus[0].mig_devices[2].uuid));
    }
}
