//! The statements of [`super::WebhookStore::deliver`], the same for every SQL store but for the
//! form of "insert unless present".

use super::dialect::{Backend, Shared, Upsert};
use super::schema::{webhook_deliveries, webhook_refs};
use super::sql::{Param, SqlRow};
use super::{Delivery, MetaError, RefFact, RefKind};
use crate::model::RepoId;

/// `INSERT … VALUES (…)` that does nothing when the row's key is present, in `backend`'s form.
fn insert_unless_present(backend: Backend, table: &str, columns: &[&str]) -> String {
    let values = vec!["?"; columns.len()].join(", ");
    let columns = columns.join(", ");
    match backend.upsert() {
        Upsert::OnDuplicateKey => {
            format!("INSERT IGNORE INTO {table} ({columns}) VALUES ({values})")
        }
        Upsert::OnConflict => {
            format!("INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING")
        }
    }
}

/// Records a delivery: changes one row if it is new, none if it was received before.
pub(super) static RECORD_DELIVERY: Shared = Shared::per_backend(|backend| {
    insert_unless_present(
        backend,
        "webhook_deliveries",
        &[
            webhook_deliveries::delivery.name,
            webhook_deliveries::received_at.name,
        ],
    )
});

const REF_COLUMNS: [&str; 6] = [
    webhook_refs::repository.name,
    webhook_refs::sha.name,
    webhook_refs::kind.name,
    webhook_refs::git_ref.name,
    webhook_refs::base_ref.name,
    webhook_refs::received_at.name,
];

/// Records a fact; one known already keeps its first time (a pull request's head was pushed
/// when it was first said to be).
pub(super) static RECORD_REF: Shared =
    Shared::per_backend(|backend| insert_unless_present(backend, "webhook_refs", &REF_COLUMNS));

pub(super) static FORGET_DELIVERIES: Shared =
    Shared::new("DELETE FROM webhook_deliveries WHERE received_at < ?");
pub(super) static FORGET_REFS: Shared =
    Shared::new("DELETE FROM webhook_refs WHERE received_at < ?");

/// What is known about one commit of one repository.
pub(super) static REFS_OF_COMMIT: Shared = Shared::built(|| {
    format!(
        "SELECT {} FROM webhook_refs WHERE repository = ? AND sha = ? ORDER BY received_at, kind",
        REF_COLUMNS.join(", ")
    )
});

pub(super) fn ref_params(fact: &RefFact) -> Vec<Param> {
    vec![
        Param::Text(fact.repository.as_str().to_owned()),
        Param::Text(fact.sha.clone()),
        Param::Int(fact.kind.code()),
        Param::Text(fact.git_ref.clone()),
        Param::Text(fact.base_ref.clone()),
        Param::Int(fact.received_at),
    ]
}

/// What a statement of [`delivery_statements`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// Forgets what is old.
    Forget,
    /// Records one of the delivery's keys (changes a row if it was not recorded).
    Record,
    /// Reads whether one of its keys was recorded (a row if so).
    Check,
    /// Records a fact.
    Fact,
    /// Reads what is known about the commit asked about (last).
    About,
}

/// Whether any of the delivery's keys was recorded before.
pub(super) static CHECK_DELIVERY: Shared =
    Shared::new("SELECT delivery FROM webhook_deliveries WHERE delivery = ?");

/// The statements of a delivery, in order, each with its parameters and part: forget the old (if
/// asked),
/// record its keys (or check them), record its facts, then, if asked, read what is known about
/// its commit.
pub(super) fn delivery_statements(
    delivery: &Delivery<'_>,
) -> Vec<(&'static Shared, Vec<Param>, Part)> {
    let mut statements = Vec::new();
    if let Some(before) = delivery.forget_before {
        statements.push((&FORGET_DELIVERIES, vec![Param::Int(before)], Part::Forget));
        statements.push((&FORGET_REFS, vec![Param::Int(before)], Part::Forget));
    }
    for key in delivery.keys {
        statements.push(match delivery.record {
            true => (
                &RECORD_DELIVERY,
                vec![Param::Text(key.clone()), Param::Int(delivery.now)],
                Part::Record,
            ),
            false => (&CHECK_DELIVERY, vec![Param::Text(key.clone())], Part::Check),
        });
    }
    statements.extend(
        delivery
            .facts
            .iter()
            .map(|f| (&RECORD_REF, ref_params(f), Part::Fact)),
    );
    if let Some((repository, sha)) = delivery.about {
        statements.push((&REFS_OF_COMMIT, about_params(repository, sha), Part::About));
    }
    statements
}

fn about_params(repository: &RepoId, sha: &str) -> Vec<Param> {
    vec![
        Param::Text(repository.as_str().to_owned()),
        Param::Text(sha.to_owned()),
    ]
}

pub(super) fn ref_from_row(r: &impl SqlRow) -> Result<RefFact, MetaError> {
    let kind = r.read(webhook_refs::kind)?;
    Ok(RefFact {
        repository: RepoId::new(r.read(webhook_refs::repository)?),
        sha: r.read(webhook_refs::sha)?,
        kind: RefKind::from_code(kind)
            .ok_or_else(|| MetaError::Corrupt(format!("webhook_refs.kind {kind}")))?,
        git_ref: r.read(webhook_refs::git_ref)?,
        base_ref: r.read(webhook_refs::base_ref)?,
        received_at: r.read(webhook_refs::received_at)?,
    })
}
