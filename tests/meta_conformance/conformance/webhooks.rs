//! GitHub's webhook deliveries: recorded once, what they said kept and answered per commit,
//! and both forgotten after a while.

use super::*;

use hoard::meta::{Delivered, Delivery, RefFact, RefKind};

pub async fn run(store: &dyn MetaStore) {
    a_delivery_is_new_once_and_its_facts_meet_in_either_order(store).await;
    asking_records_nothing_and_any_key_is_the_delivery(store).await;
    old_deliveries_and_facts_are_forgotten(store).await;
}

fn fact(repo: &str, sha: &str, kind: RefKind, git_ref: &str, base_ref: &str, at: i64) -> RefFact {
    RefFact {
        repository: RepoId::new(repo),
        sha: sha.into(),
        kind,
        git_ref: git_ref.into(),
        base_ref: base_ref.into(),
        received_at: at,
    }
}

/// Records delivery `id` (its only key) with `facts`, asking about `about`.
async fn deliver(
    store: &dyn MetaStore,
    id: &str,
    facts: &[RefFact],
    about: Option<(&RepoId, &str)>,
    now: i64,
) -> Delivered {
    store
        .deliver(&Delivery {
            keys: &[id.to_owned()],
            record: true,
            now,
            facts,
            about,
            forget_before: None,
        })
        .await
        .unwrap()
}

async fn a_delivery_is_new_once_and_its_facts_meet_in_either_order(store: &dyn MetaStore) {
    let repo = RepoId::new("hook-1");
    let queue = "refs/heads/gh-readonly-queue/main/pr-1-abc";
    let group = fact("hook-1", "aaa", RefKind::MergeGroup, queue, MAIN, 10);
    assert_eq!(
        deliver(
            store,
            "hook-d1",
            std::slice::from_ref(&group),
            Some((&repo, "aaa")),
            10
        )
        .await,
        Delivered::New(vec![group.clone()]),
        "a new delivery answers what is known of its commit, itself included"
    );
    // The push that lands it: the group is known.
    let push = fact("hook-1", "aaa", RefKind::Push, MAIN, "", 20);
    assert_eq!(
        deliver(
            store,
            "hook-d2",
            std::slice::from_ref(&push),
            Some((&repo, "aaa")),
            20
        )
        .await,
        Delivered::New(vec![group.clone(), push.clone()])
    );
    // A redelivery (the same delivery, later) is seen.
    let redelivered = fact("hook-1", "aaa", RefKind::Push, MAIN, "", 30);
    let seen = deliver(store, "hook-d2", &[redelivered], Some((&repo, "aaa")), 30).await;
    assert_eq!(seen, Delivered::Seen);
    // A fact known already keeps its first time; other commits and repositories are apart.
    let again = fact("hook-1", "aaa", RefKind::Push, MAIN, "", 40);
    assert_eq!(
        deliver(
            store,
            "hook-d3",
            std::slice::from_ref(&again),
            Some((&repo, "aaa")),
            40
        )
        .await,
        Delivered::New(vec![group, push])
    );
    assert_eq!(
        deliver(store, "hook-d4", &[], Some((&repo, "bbb")), 50).await,
        Delivered::New(vec![])
    );
    assert_eq!(
        deliver(
            store,
            "hook-d5",
            &[],
            Some((&RepoId::new("hook-2"), "aaa")),
            50
        )
        .await,
        Delivered::New(vec![])
    );
    assert_eq!(
        deliver(store, "hook-d6", &[], None, 50).await,
        Delivered::New(vec![]),
        "a delivery that asks nothing"
    );
}

async fn asking_records_nothing_and_any_key_is_the_delivery(store: &dyn MetaStore) {
    let keys = ["hook-ask-1".to_owned(), "sha256:body-1".to_owned()];
    let fact = fact("hook-ask", "ddd", RefKind::Push, MAIN, "", 5);
    let ask = Delivery {
        keys: &keys,
        record: false,
        now: 5,
        facts: std::slice::from_ref(&fact),
        about: None,
        forget_before: None,
    };
    assert_eq!(store.deliver(&ask).await.unwrap(), Delivered::New(vec![]));
    assert_eq!(
        store.deliver(&ask).await.unwrap(),
        Delivered::New(vec![]),
        "asking does not record the delivery"
    );
    let repo = RepoId::new("hook-ask");
    let about = Delivery {
        facts: &[],
        about: Some((&repo, "ddd")),
        ..ask.clone()
    };
    assert_eq!(
        store.deliver(&about).await.unwrap(),
        Delivered::New(vec![fact.clone()]),
        "but keeps its facts"
    );
    let record = Delivery {
        record: true,
        facts: &[],
        ..ask.clone()
    };
    assert_eq!(
        store.deliver(&record).await.unwrap(),
        Delivered::New(vec![])
    );
    assert_eq!(store.deliver(&ask).await.unwrap(), Delivered::Seen);
    assert_eq!(
        store.deliver(&record).await.unwrap(),
        Delivered::Seen,
        "recorded once"
    );
    // The same body under another id (a replay) is the same delivery.
    let replay_keys = ["hook-ask-2".to_owned(), "sha256:body-1".to_owned()];
    let replay = Delivery {
        keys: &replay_keys,
        ..ask
    };
    assert_eq!(store.deliver(&replay).await.unwrap(), Delivered::Seen);
}

async fn old_deliveries_and_facts_are_forgotten(store: &dyn MetaStore) {
    let repo = RepoId::new("hook-old");
    let old = fact("hook-old", "ccc", RefKind::Push, MAIN, "", 100);
    deliver(store, "hook-old-1", &[old], None, 100).await;
    let keys = ["hook-old-2".to_owned()];
    let later = Delivery {
        keys: &keys,
        record: true,
        now: 1_000,
        facts: &[],
        about: Some((&repo, "ccc")),
        forget_before: Some(500),
    };
    assert_eq!(
        store.deliver(&later).await.unwrap(),
        Delivered::New(vec![]),
        "forgotten"
    );
    let old_keys = ["hook-old-1".to_owned()];
    let redelivered = Delivery {
        keys: &old_keys,
        ..later
    };
    assert!(
        matches!(
            store.deliver(&redelivered).await.unwrap(),
            Delivered::New(_)
        ),
        "a delivery forgotten counts as new again"
    );
}
