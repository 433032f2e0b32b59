//! GitHub's webhooks (issue #58): what a verified delivery means for the cache.
//!
//! - `merge_group` (`checks_requested`): the group's branch and head commit are remembered.
//!   When a `push` to the group's base branch lands that commit (in either order, on any
//!   replica: both are kept in the database), the entries the queue's runs saved in the group's
//!   branch are promoted into the base branch.
//! - `merge_group` (`destroyed`, not merged): the group's entries are expired at once; no run
//!   can ever read them.
//! - `pull_request` (`opened`, `reopened`, `synchronize`): when the pull request's head was
//!   pushed is remembered. `closed` with `merged`: if the policy file opts the repository in
//!   (`[[promotion]]`, never for a fork unless it says so), the entries of `refs/pull/N/merge`
//!   written since its final head was pushed are promoted into its base branch.
//! - A delivery received before (GitHub redelivers with the same id; a relay could replay its
//!   signed body under another) is not applied again. It counts as received once what it asks
//!   is done: one that failed half-way is applied again when GitHub redelivers it (promotion is
//!   idempotent: what was promoted is found present).
//!
//! The promotion's own rules (policy, immutability, quota) are [`super::promotion`]'s.

use serde::Deserialize;

use crate::meta::{Delivered, Delivery, RefFact, RefKind};
use crate::model::{EntryFilter, EntryPage, LogSafe, Millis, RemovalCause, RepoId, Scope};

use super::policy::Promotions;
use super::promotion::{PromotionReport, PromotionRequest};
use super::{Cache, CacheError};

/// How long deliveries and what they said are kept: GitHub redelivers for days, and a pull
/// request's head may wait weeks for its merge.
pub const WEBHOOK_MEMORY: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// A delivery whose signature was verified.
#[derive(Debug, Clone, Copy)]
pub struct GithubDelivery<'a> {
    /// `X-GitHub-Delivery`.
    pub id: &'a str,
    /// `X-GitHub-Event`.
    pub event: &'a str,
    pub body: &'a [u8],
}

/// What a delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied: the promotions it made and the entries it expired (none for a delivery that
    /// only told hoard something to remember).
    Applied { promoted: u64, expired: u64 },
    /// Received before: not applied again.
    Seen,
    /// An event or action hoard does not act on.
    Ignored,
}

/// Applied, and nothing to promote or expire: a delivery that only told hoard something.
const NOTED: Outcome = Outcome::Applied {
    promoted: 0,
    expired: 0,
};

/// Why a delivery cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("the delivery's body is not the {0} event GitHub sends: {1}")]
    Malformed(String, String),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

#[derive(Deserialize)]
struct Repository {
    id: u64,
    #[serde(default)]
    full_name: String,
}

#[derive(Deserialize)]
struct MergeGroupEvent {
    action: String,
    #[serde(default)]
    reason: Option<String>,
    merge_group: MergeGroup,
    repository: Repository,
}

#[derive(Deserialize)]
struct MergeGroup {
    head_sha: String,
    head_ref: String,
    base_ref: String,
}

#[derive(Deserialize)]
struct PushEvent {
    #[serde(rename = "ref")]
    git_ref: String,
    after: String,
    #[serde(default)]
    deleted: bool,
    repository: Repository,
}

#[derive(Deserialize)]
struct PullRequestEvent {
    action: String,
    number: u64,
    pull_request: PullRequest,
    repository: Repository,
}

#[derive(Deserialize)]
struct PullRequest {
    #[serde(default)]
    merged: bool,
    #[serde(default)]
    created_at: Option<String>,
    head: Branch,
    base: Branch,
}

#[derive(Deserialize)]
struct Branch {
    #[serde(rename = "ref")]
    name: String,
    sha: String,
    /// `null` when the head repository was deleted.
    repo: Option<BranchRepository>,
}

#[derive(Deserialize)]
struct BranchRepository {
    id: u64,
}

/// A delivery being applied: its id, and the keys it is recorded under ([`keys`], worked out
/// once: the digest reads the whole body).
struct Received<'a> {
    id: &'a str,
    keys: [String; 2],
}

/// What a delivery is known by: its id, and the digest of its signed body.
fn keys(delivery: GithubDelivery<'_>) -> [String; 2] {
    use sha2::{Digest, Sha256};
    [
        delivery.id.to_owned(),
        format!("sha256:{}", hex::encode(Sha256::digest(delivery.body))),
    ]
}

fn parse<'a, T: Deserialize<'a>>(event: &str, body: &'a [u8]) -> Result<T, DeliveryError> {
    serde_json::from_slice(body).map_err(|e| {
        DeliveryError::Malformed(event.to_owned(), LogSafe(&e.to_string()).to_string())
    })
}

impl Cache {
    /// Applies a verified delivery (see the module).
    pub async fn github_delivery(
        &self,
        delivery: GithubDelivery<'_>,
    ) -> Result<Outcome, DeliveryError> {
        let received = Received {
            id: delivery.id,
            keys: keys(delivery),
        };
        let outcome = match delivery.event {
            "merge_group" => {
                let event: MergeGroupEvent = parse(delivery.event, delivery.body)?;
                self.merge_group(&received, event).await?
            }
            "push" => {
                let event: PushEvent = parse(delivery.event, delivery.body)?;
                self.push(&received, event).await?
            }
            "pull_request" => {
                let event: PullRequestEvent = parse(delivery.event, delivery.body)?;
                self.pull_request(&received, event).await?
            }
            _ => Outcome::Ignored,
        };
        if let Outcome::Applied { .. } = outcome {
            // Received now, and what is older than memory forgotten (once per delivery).
            let memory = WEBHOOK_MEMORY.as_millis() as Millis;
            let now = self.clock.now();
            self.meta
                .deliver(&Delivery {
                    keys: &received.keys,
                    record: true,
                    now,
                    facts: &[],
                    about: None,
                    forget_before: Some(now.saturating_sub(memory)),
                })
                .await
                .map_err(CacheError::from)?;
        }
        Ok(outcome)
    }

    /// The promotions the webhooks make for `repository` (named `name` by the delivery).
    fn promotions_for(&self, repository: &RepoId, name: &str) -> Promotions {
        self.write_policy
            .with(|p| p.promotions_for(repository.as_str(), name))
            .unwrap_or_default()
    }

    /// Keeps what `delivery` says (`facts`) and answers what is known about `about` once they
    /// are kept; `None` if it was received before. The answer is read after the facts are
    /// committed: of a merge group and its push handled at once by two replicas, the later
    /// to commit sees both.
    async fn remember(
        &self,
        received: &Received<'_>,
        facts: &[RefFact],
        about: Option<(&RepoId, &str)>,
    ) -> Result<Option<Vec<RefFact>>, CacheError> {
        let ask = |facts, about| Delivery {
            keys: &received.keys,
            record: false,
            now: self.clock.now(),
            facts,
            about,
            forget_before: None,
        };
        if self.meta.deliver(&ask(facts, None)).await? == Delivered::Seen {
            return Ok(None);
        }
        if about.is_none() {
            return Ok(Some(Vec::new()));
        }
        Ok(match self.meta.deliver(&ask(&[], about)).await? {
            Delivered::Seen => None,
            Delivered::New(known) => Some(known),
        })
    }

    async fn merge_group(
        &self,
        received: &Received<'_>,
        event: MergeGroupEvent,
    ) -> Result<Outcome, DeliveryError> {
        let repository = RepoId::new(event.repository.id.to_string());
        let group = &event.merge_group;
        match event.action.as_str() {
            "checks_requested" => {
                let fact = RefFact {
                    repository: repository.clone(),
                    sha: group.head_sha.clone(),
                    kind: RefKind::MergeGroup,
                    git_ref: group.head_ref.clone(),
                    base_ref: group.base_ref.clone(),
                    received_at: self.clock.now(),
                };
                let about = Some((&repository, group.head_sha.as_str()));
                let Some(known) = self.remember(received, &[fact], about).await? else {
                    return Ok(Outcome::Seen);
                };
                // The push that lands it may have come first.
                let landed = known
                    .iter()
                    .any(|f| f.kind == RefKind::Push && f.git_ref == group.base_ref);
                let promoted = match landed {
                    true => {
                        self.promote_group(
                            received,
                            &repository,
                            &event.repository.full_name,
                            &group.head_ref,
                            &group.base_ref,
                        )
                        .await?
                    }
                    false => 0,
                };
                Ok(Outcome::Applied {
                    promoted,
                    expired: 0,
                })
            }
            "destroyed" => {
                if self.remember(received, &[], None).await?.is_none() {
                    return Ok(Outcome::Seen);
                }
                // Merged: the push promotes. Otherwise (invalidated, dequeued) no run can ever
                // read what the group's runs saved.
                let rules = self.promotions_for(&repository, &event.repository.full_name);
                let expired = match event.reason.as_deref() {
                    Some("merged") => 0,
                    _ if !rules.merge_queues => 0,
                    _ => {
                        self.expire_scope(&repository, &Scope::new(group.head_ref.as_str()))
                            .await?
                    }
                };
                Ok(Outcome::Applied {
                    promoted: 0,
                    expired,
                })
            }
            _ => Ok(Outcome::Ignored),
        }
    }

    async fn push(
        &self,
        received: &Received<'_>,
        event: PushEvent,
    ) -> Result<Outcome, DeliveryError> {
        if event.deleted || !event.git_ref.starts_with("refs/heads/") {
            let known = self.remember(received, &[], None).await?;
            return Ok(known.map_or(Outcome::Seen, |_| NOTED));
        }
        let repository = RepoId::new(event.repository.id.to_string());
        let fact = RefFact {
            repository: repository.clone(),
            sha: event.after.clone(),
            kind: RefKind::Push,
            git_ref: event.git_ref.clone(),
            base_ref: String::new(),
            received_at: self.clock.now(),
        };
        let about = Some((&repository, event.after.as_str()));
        let Some(known) = self.remember(received, &[fact], about).await? else {
            return Ok(Outcome::Seen);
        };
        let mut promoted = 0;
        for group in known
            .iter()
            .filter(|f| f.kind == RefKind::MergeGroup && f.base_ref == event.git_ref)
        {
            promoted += self
                .promote_group(
                    received,
                    &repository,
                    &event.repository.full_name,
                    &group.git_ref,
                    &event.git_ref,
                )
                .await?;
        }
        Ok(Outcome::Applied {
            promoted,
            expired: 0,
        })
    }

    async fn pull_request(
        &self,
        received: &Received<'_>,
        event: PullRequestEvent,
    ) -> Result<Outcome, DeliveryError> {
        let repository = RepoId::new(event.repository.id.to_string());
        let merge_ref = format!("refs/pull/{}/merge", event.number);
        let head = &event.pull_request.head;
        match event.action.as_str() {
            "opened" | "reopened" | "synchronize" => {
                let fact = RefFact {
                    repository: repository.clone(),
                    sha: head.sha.clone(),
                    kind: RefKind::PullHead,
                    git_ref: merge_ref,
                    base_ref: String::new(),
                    received_at: self.clock.now(),
                };
                let known = self.remember(received, &[fact], None).await?;
                Ok(known.map_or(Outcome::Seen, |_| NOTED))
            }
            "closed" => {
                let about = Some((&repository, head.sha.as_str()));
                let Some(known) = self.remember(received, &[], about).await? else {
                    return Ok(Outcome::Seen);
                };
                if !event.pull_request.merged {
                    return Ok(NOTED);
                }
                let rules = self.promotions_for(&repository, &event.repository.full_name);
                // A head in another repository (or one deleted since) is a fork's. `fork` is no
                // help: it is true of every pull request of a repository that is a fork itself.
                let fork = head
                    .repo
                    .as_ref()
                    .is_none_or(|r| r.id != event.repository.id);
                if !rules.merged_pull_requests || (fork && !rules.forks) {
                    tracing::info!(
                        target: "hoard::audit",
                        action = "promote_skipped",
                        delivery = %LogSafe(received.id),
                        repository = %LogSafe(repository.as_str()),
                        pull_request = event.number,
                        reason = if rules.merged_pull_requests { "fork" } else { "not opted in" },
                    );
                    return Ok(NOTED);
                }
                // Only what was saved for the final head: since it was pushed, if a delivery
                // said so, else since the pull request was opened.
                let pushed = known
                    .iter()
                    .filter(|f| f.kind == RefKind::PullHead && f.git_ref == merge_ref)
                    .map(|f| f.received_at)
                    .min();
                let opened = event
                    .pull_request
                    .created_at
                    .as_deref()
                    .and_then(|t| humantime::parse_rfc3339(t).ok())
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as Millis);
                let from = Scope::new(merge_ref.as_str());
                let to = Scope::new(format!("refs/heads/{}", event.pull_request.base.name));
                let cause = format!("pull_request:{}", event.number);
                let report = self
                    .promote(&PromotionRequest {
                        repository: &repository,
                        from_scope: &from,
                        to_scope: &to,
                        written_after: pushed.or(opened),
                        by: received.id,
                        cause: &cause,
                        dry_run: false,
                    })
                    .await?;
                Ok(Outcome::Applied {
                    promoted: report.promoted.len() as u64,
                    expired: 0,
                })
            }
            _ => Ok(Outcome::Ignored),
        }
    }

    /// Promotes a merge group's entries into the branch it merged into, if the policy lets the
    /// repository's merge queues promote; how many entries.
    async fn promote_group(
        &self,
        received: &Received<'_>,
        repository: &RepoId,
        name: &str,
        head_ref: &str,
        base_ref: &str,
    ) -> Result<u64, CacheError> {
        let rules = self.promotions_for(repository, name);
        if !rules.merge_queues {
            return Ok(0);
        }
        let (from, to) = (Scope::new(head_ref), Scope::new(base_ref));
        let cause = format!("merge_group:{head_ref}");
        let report: PromotionReport = self
            .promote(&PromotionRequest {
                repository,
                from_scope: &from,
                to_scope: &to,
                written_after: None,
                by: received.id,
                cause: &cause,
                dry_run: false,
            })
            .await?;
        Ok(report.promoted.len() as u64)
    }

    /// Expires every entry of `scope` in `repository` now; how many went.
    async fn expire_scope(&self, repository: &RepoId, scope: &Scope) -> Result<u64, CacheError> {
        let filter = EntryFilter {
            repository_id: Some(repository.as_str().to_owned()),
            scope: Some(scope.clone()),
            ..EntryFilter::default()
        };
        let mut expired = 0;
        loop {
            let batch = self
                .meta
                .select_entries(&EntryPage::by_creation(&filter, 500))
                .await?
                .entries;
            if batch.is_empty() {
                return Ok(expired);
            }
            let ids: Vec<_> = batch.iter().map(|l| l.entry.id).collect();
            let removed = self.remove(&ids, RemovalCause::Expired).await?;
            if removed.is_empty() {
                return Ok(expired);
            }
            expired += removed.len() as u64;
        }
    }
}
