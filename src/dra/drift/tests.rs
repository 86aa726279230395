use super::*;

fn versions(v: &[(&str, &str)]) -> Versions {
    v.iter()
        .map(|(n, r)| (n.to_string(), r.to_string()))
        .collect()
}

fn listed(view: &mut View, items: &[(&str, &str)], copies: Option<&Versions>) -> Verdict {
    assert_eq!(view.observe(Seen::Listing, copies), Verdict::Agrees);
    for (n, r) in items {
        let v = view.observe(Seen::Listed(n.to_string(), r.to_string()), copies);
        assert_eq!(
            v,
            Verdict::Agrees,
            "nothing is judged while a LIST is under way"
        );
    }
    view.observe(Seen::ListDone, copies)
}

fn apply(view: &mut View, name: &str, version: &str, copies: Option<&Versions>) -> Verdict {
    view.observe(Seen::Applied(name.to_string(), version.to_string()), copies)
}

fn delete(view: &mut View, name: &str, copies: Option<&Versions>) -> Verdict {
    view.observe(Seen::Deleted(name.to_string()), copies)
}

/// The kubelet's wipe: the watch shows the publisher's own versions, then deletes them.
#[test]
fn deleting_the_publishers_own_version_is_drift_at_once() {
    let copies = versions(&[("s-0", "5"), ("s-1", "6")]);
    let mut view = View::default();
    assert_eq!(
        listed(&mut view, &[("s-0", "5"), ("s-1", "6")], Some(&copies)),
        Verdict::Agrees
    );
    assert_eq!(delete(&mut view, "s-0", Some(&copies)), Verdict::Drifted);
}

/// Another writer replaces a slice after the publisher's write was seen.
#[test]
fn rewriting_the_publishers_own_version_is_drift_at_once() {
    let copies = versions(&[("s-0", "5")]);
    let mut view = View::default();
    assert_eq!(
        listed(&mut view, &[("s-0", "5")], Some(&copies)),
        Verdict::Agrees
    );
    assert_eq!(
        apply(&mut view, "s-0", "7", Some(&copies)),
        Verdict::Drifted
    );
}

/// The publisher's own writes reach the watch after the copies changed: it lags, then agrees.
#[test]
fn the_publishers_own_writes_lag_then_agree() {
    let mut view = View::default();
    assert_eq!(
        listed(&mut view, &[], None),
        Verdict::Agrees,
        "no copies yet"
    );
    // The first reconcile created two slices; the watch has not shown them yet.
    let copies = versions(&[("s-0", "5"), ("s-1", "6")]);
    assert_eq!(view.judge(Some(&copies)), Verdict::Lags);
    assert_eq!(apply(&mut view, "s-0", "5", Some(&copies)), Verdict::Lags);
    assert_eq!(apply(&mut view, "s-1", "6", Some(&copies)), Verdict::Agrees);
    // A second reconcile replaced s-0 twice (a stale echo of the first write comes first) and
    // deleted s-1.
    let copies = versions(&[("s-0", "8")]);
    assert_eq!(apply(&mut view, "s-0", "7", Some(&copies)), Verdict::Lags);
    assert_eq!(apply(&mut view, "s-0", "8", Some(&copies)), Verdict::Lags);
    assert_eq!(delete(&mut view, "s-1", Some(&copies)), Verdict::Agrees);
}

/// A LIST from before the publisher's writes (the watch cache may lag) is not drift by
/// itself: the watch brings the writes after it.
#[test]
fn a_list_from_before_the_writes_lags() {
    let copies = versions(&[("s-0", "5")]);
    let mut view = View::default();
    assert_eq!(
        listed(&mut view, &[("old", "2")], Some(&copies)),
        Verdict::Lags
    );
    assert_eq!(apply(&mut view, "s-0", "5", Some(&copies)), Verdict::Lags);
    assert_eq!(delete(&mut view, "old", Some(&copies)), Verdict::Agrees);
}

/// Without copies (the publisher lists at its next reconcile) or without a synced view,
/// nothing is judged; a broken watch stops judging until it answers again.
#[test]
fn nothing_is_judged_without_copies_or_a_synced_view() {
    let copies = versions(&[("s-0", "5")]);
    let mut view = View::default();
    assert_eq!(view.judge(Some(&copies)), Verdict::Agrees, "not synced");
    assert_eq!(listed(&mut view, &[], None), Verdict::Agrees);
    assert_eq!(delete(&mut view, "s-0", None), Verdict::Agrees);
    assert_eq!(
        listed(&mut view, &[("s-0", "5")], Some(&copies)),
        Verdict::Agrees
    );
    assert_eq!(
        view.observe(Seen::Broken("connection refused".into()), Some(&copies)),
        Verdict::Agrees
    );
    let moved = versions(&[("s-0", "6")]);
    assert_eq!(
        view.judge(Some(&moved)),
        Verdict::Agrees,
        "broken: not judged"
    );
    // The watch resumes: its next event syncs the view again.
    assert_eq!(apply(&mut view, "s-0", "6", Some(&moved)), Verdict::Agrees);
    assert_eq!(delete(&mut view, "s-0", Some(&moved)), Verdict::Drifted);
}

#[test]
fn versions_of_names_each_slice() {
    let mut s = ResourceSlice::default();
    s.metadata.name = Some("s-0".into());
    s.metadata.resource_version = Some("5".into());
    assert_eq!(versions_of(&[s]), versions(&[("s-0", "5")]));
}

/// The watcher's events become the view's, a slice by name and version.
#[test]
fn watch_events_become_names_and_versions() {
    let mut m = PartialObjectMeta::<ResourceSlice>::default();
    m.metadata.name = Some("s-0".into());
    m.metadata.resource_version = Some("5".into());
    assert_eq!(Seen::of(Event::Init), Some(Seen::Listing));
    assert_eq!(
        Seen::of(Event::InitApply(m.clone())),
        Some(Seen::Listed("s-0".into(), "5".into()))
    );
    assert_eq!(Seen::of(Event::InitDone), Some(Seen::ListDone));
    assert_eq!(
        Seen::of(Event::Apply(m.clone())),
        Some(Seen::Applied("s-0".into(), "5".into()))
    );
    assert_eq!(
        Seen::of(Event::Delete(m)),
        Some(Seen::Deleted("s-0".into()))
    );
    assert_eq!(Seen::of(Event::Apply(PartialObjectMeta::default())), None);
}
