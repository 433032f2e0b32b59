//! `StatsStore`: counts add up per repository, family, class and hour, answer by filter and
//! width, fold into days without losing a count, and families are kept as told. Entries keep
//! their family and ref class, lookups see sizes, and removals report both.

use super::*;
use hoard::model::{Bucket, Counters, Evictions, RefClass, StatsFilter, StatsKey, StatsRow};
use hoard::model::{StatsQuery, StatsRows};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
/// Far from the times the other parts use, so that the server's rows are this part's alone.
const T0: i64 = 1000 * DAY;

pub async fn run(store: &dyn MetaStore) {
    counts_add_up_and_answer_by_filter_and_width(store).await;
    families_are_kept_as_told(store).await;
    entries_keep_family_and_class(store).await;
    hours_fold_into_days_and_old_days_go(store).await;
}

/// `store.stats` of `filter`, summed as `rows` says.
async fn stats(store: &dyn MetaStore, filter: &StatsFilter, rows: StatsRows<'_>) -> Vec<StatsRow> {
    store.stats(&StatsQuery { filter, rows }).await.unwrap()
}

fn key(repo: &str, family: &str, class: RefClass, hour: i64) -> StatsKey {
    StatsKey {
        repository: RepoId::new(repo),
        family: family.into(),
        class,
        hour,
    }
}

fn counts(lookups: u64, misses: u64, saves: u64, evicted: u64) -> Counters {
    Counters {
        lookups,
        exact_hits: lookups - misses,
        restore_key_hits: 0,
        misses,
        bytes_restored: 10 * (lookups - misses),
        saves,
        bytes_saved: 100 * saves,
        evictions: Evictions {
            evicted,
            ..Evictions::default()
        },
        // Never zero and unlike the others, so that a column not written, not read or read
        // as another fails every comparison of whole counters below.
        refused_writes: 7 * saves + 1,
        refused_reads: 3 * misses + 2,
        promoted_hits: 5 * lookups + 3,
    }
}

fn all_time() -> StatsFilter {
    StatsFilter {
        since: T0 - 400 * DAY,
        until: T0 + 400 * DAY,
        ..StatsFilter::default()
    }
}

fn summary(rows: &[StatsRow]) -> Vec<(String, String, RefClass, i64, u64, u64, u64)> {
    let mut out: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.repository.as_str().to_owned(),
                r.family.clone(),
                r.class,
                r.start,
                r.counters.lookups,
                r.counters.saves,
                r.counters.evictions.total(),
            )
        })
        .collect();
    out.sort();
    out
}

async fn counts_add_up_and_answer_by_filter_and_width(store: &dyn MetaStore) {
    let pr = RefClass::PullRequest;
    let main = RefClass::DefaultBranch;
    let batch = vec![
        (key("stats-a", "npm-", main, T0), counts(3, 1, 1, 0)),
        (key("stats-a", "npm-", main, T0 + HOUR), counts(2, 2, 0, 1)),
        (key("stats-a", "npm-", pr, T0), counts(1, 1, 1, 0)),
        (key("stats-a", "pip-", main, T0), counts(4, 0, 0, 0)),
        (key("stats-b", "npm-", main, T0), counts(5, 5, 0, 0)),
    ];
    store.record_stats(&batch).await.unwrap();
    // The same rows again add to them: a flush never replaces.
    store.record_stats(&batch[..1]).await.unwrap();

    let a = StatsFilter {
        repository: Some(RepoId::new("stats-a")),
        ..all_time()
    };
    let hourly = stats(store, &a, StatsRows::Families(Bucket::Hour)).await;
    assert_eq!(
        summary(&hourly),
        [
            ("stats-a".into(), "npm-".into(), main, T0, 6, 2, 0),
            ("stats-a".into(), "npm-".into(), main, T0 + HOUR, 2, 0, 1),
            ("stats-a".into(), "npm-".into(), pr, T0, 1, 1, 0),
            ("stats-a".into(), "pip-".into(), main, T0, 4, 0, 0),
        ],
        "family rows add up per repository, family, class and hour"
    );
    let row = hourly
        .iter()
        .find(|r| r.family == "npm-" && r.class == main && r.start == T0)
        .unwrap();
    assert_eq!(row.counters, {
        let mut twice = counts(3, 1, 1, 0);
        twice.add(&counts(3, 1, 1, 0));
        twice
    });

    let daily = stats(
        store,
        &StatsFilter {
            family: Some("npm-".into()),
            class: Some(main),
            ..a.clone()
        },
        StatsRows::Families(Bucket::Day),
    )
    .await;
    assert_eq!(
        summary(&daily),
        [(
            "stats-a".into(),
            "npm-".into(),
            main,
            T0 - T0 % DAY,
            8,
            2,
            1
        )],
        "a day width sums the day's hours; family and class filter"
    );

    // Totals: one row per line over the whole period, what a family table ranks.
    let totals = stats(store, &a, StatsRows::FamilyTotals).await;
    assert_eq!(
        summary(&totals),
        [
            ("stats-a".into(), "npm-".into(), main, T0, 8, 2, 1),
            ("stats-a".into(), "npm-".into(), pr, T0, 1, 1, 0),
            ("stats-a".into(), "pip-".into(), main, T0, 4, 0, 0),
        ],
        "family totals sum each line's hours, starting at its earliest"
    );
    // Trends of chosen lines only.
    let chosen = [
        (RepoId::new("stats-a"), "npm-".to_owned(), main),
        (RepoId::new("stats-b"), "npm-".to_owned(), main),
    ];
    let lines = stats(store, &all_time(), StatsRows::Lines(Bucket::Hour, &chosen)).await;
    assert_eq!(
        summary(&lines),
        [
            ("stats-a".into(), "npm-".into(), main, T0, 6, 2, 0),
            ("stats-a".into(), "npm-".into(), main, T0 + HOUR, 2, 0, 1),
            ("stats-b".into(), "npm-".into(), main, T0, 5, 0, 0),
        ],
        "line stats are the family rows of the chosen lines and no other"
    );
    assert!(
        stats(store, &all_time(), StatsRows::Lines(Bucket::Hour, &[]))
            .await
            .is_empty()
    );

    let later = StatsFilter {
        since: T0 + HOUR,
        ..a.clone()
    };
    assert_eq!(
        stats(store, &later, StatsRows::Families(Bucket::Hour))
            .await
            .len(),
        1,
        "since is inclusive, by the rows' start"
    );

    let server = stats(store, &all_time(), StatsRows::Server(Bucket::Hour)).await;
    let per: Vec<(RefClass, i64, u64)> = server
        .iter()
        .map(|r| (r.class, r.start, r.counters.lookups))
        .collect();
    let mut per = per;
    per.sort();
    assert_eq!(
        per,
        [(main, T0, 3 + 4 + 5 + 3), (main, T0 + HOUR, 2), (pr, T0, 1)],
        "the server's rows sum every repository and family"
    );
    let mut recorded = Counters::default();
    for (_, c) in batch.iter().chain(&batch[..1]) {
        recorded.add(c);
    }
    let mut served = Counters::default();
    for r in &server {
        served.add(&r.counters);
    }
    assert_eq!(
        (served.refused_writes, served.refused_reads),
        (recorded.refused_writes, recorded.refused_reads),
        "the server's rows count the policy's refusals"
    );
    let prs = stats(
        store,
        &StatsFilter {
            class: Some(pr),
            ..all_time()
        },
        StatsRows::Server(Bucket::Day),
    )
    .await;
    assert_eq!(prs.len(), 1);
    assert_eq!(prs[0].counters.lookups, 1);
}

async fn families_are_kept_as_told(store: &dyn MetaStore) {
    let repo = RepoId::new("stats-kept");
    let (kept, count) = store
        .families(&repo, &[], &["a-".into(), "b-".into()], T0)
        .await
        .unwrap();
    assert!(kept.is_empty() && count == 0, "nothing kept yet");
    store
        .families(&repo, &["a-".into(), "b-".into()], &[], T0)
        .await
        .unwrap();
    // Keeping again changes nothing.
    store
        .families(&repo, &["a-".into()], &[], T0)
        .await
        .unwrap();
    let (mut kept, count) = store
        .families(&repo, &[], &["a-".into(), "c-".into(), "b-".into()], T0)
        .await
        .unwrap();
    kept.sort();
    assert_eq!((kept, count), (vec!["a-".into(), "b-".into()], 2));
    // Families compare byte-wise: another case is another family.
    let (kept, _) = store
        .families(&repo, &[], &["A-".into()], T0)
        .await
        .unwrap();
    assert!(kept.is_empty(), "families compare byte-wise");
    let (_, other) = store
        .families(&RepoId::new("stats-none"), &[], &[], T0)
        .await
        .unwrap();
    assert_eq!(other, 0, "kept per repository");
}

async fn entries_keep_family_and_class(store: &dyn MetaStore) {
    let repo = "stats-stored";
    let kept = save_in_family(
        store,
        &slot(repo, "npm-1"),
        100,
        "npm-",
        RefClass::DefaultBranch,
    )
    .await;
    save_in_family(
        store,
        &slot(repo, "npm-2"),
        50,
        "npm-",
        RefClass::DefaultBranch,
    )
    .await;
    let pr = slot_in(repo, "refs/pull/1/merge", "npm-3", "v1");
    save_in_family(store, &pr, 7, "npm-", RefClass::PullRequest).await;
    save_in_family(
        store,
        &slot(repo, "weird-1"),
        3,
        "weird-",
        RefClass::OtherBranch,
    )
    .await;
    store
        .families(&RepoId::new(repo), &["npm-".into()], &[], T0)
        .await
        .unwrap();

    let mut stored: Vec<(String, RefClass, u64, u64)> = store
        .stored_by_family(Some(&RepoId::new(repo)))
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.family, s.class, s.bytes, s.entries))
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [
            ("npm-".into(), RefClass::DefaultBranch, 150, 2),
            ("npm-".into(), RefClass::PullRequest, 7, 1),
            ("other".into(), RefClass::OtherBranch, 3, 1),
        ],
        "bytes per kept family and class; families not kept count as other"
    );
    let everywhere = store.stored_by_family(None).await.unwrap();
    assert!(
        everywhere
            .iter()
            .any(|s| s.repository.as_str() == repo && s.bytes == 150),
        "without a repository, every repository's rows"
    );

    let found = store
        .find_candidates(
            &RepoId::new(repo),
            &Version::parse("v1").unwrap(),
            &[Scope::new(MAIN)],
            &["npm-1".to_owned()],
        )
        .await
        .unwrap();
    assert_eq!(
        found.first().map(|c| c.size),
        Some(100),
        "candidates carry their size"
    );

    let removed = store
        .move_entries(
            &[kept],
            EntryMove::Remove(Removal {
                from: EntryState::Live,
                cause: &RemovalCause::Evicted,
                now: T0,
                delete_at: T0,
            }),
        )
        .await
        .unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(
        (removed[0].family.as_str(), removed[0].ref_class),
        ("npm-", RefClass::DefaultBranch),
        "a removal reports the entry's family and class"
    );
}

async fn save_in_family(
    store: &dyn MetaStore,
    slot: &Slot,
    size: u64,
    family: &str,
    ref_class: RefClass,
) -> EntryId {
    let upload = reserve(store, slot, T0).await;
    let parts = vec![(block("b0"), chunk(size))];
    store
        .change_upload(&upload, UploadChange::Commit(&parts), T0)
        .await
        .unwrap();
    let upload = upload_of(store, upload.id).await.unwrap();
    let chunks = vec![parts[0].1.clone()];
    store
        .finalize(
            Some(&upload),
            NewEntry {
                family,
                ref_class,
                ..NewEntry::new(slot, &chunks, T0)
            },
        )
        .await
        .unwrap()
}

async fn hours_fold_into_days_and_old_days_go(store: &dyn MetaStore) {
    let before = stats(store, &all_time(), StatsRows::Families(Bucket::Day)).await;
    let total = |rows: &[StatsRow]| {
        let mut sum = Counters::default();
        for r in rows {
            sum.add(&r.counters);
        }
        sum
    };
    let server_before = total(&stats(store, &all_time(), StatsRows::Server(Bucket::Day)).await);
    // Fold every hour before the day after T0's.
    let day_after = T0 - T0 % DAY + DAY;
    let (folded, dropped) = store
        .fold_stats(day_after, T0 - 500 * DAY, T0 - 500 * DAY)
        .await
        .unwrap();
    assert!(folded >= 5, "the hour rows were folded ({folded})");
    assert_eq!(dropped, 0);
    let after = stats(store, &all_time(), StatsRows::Families(Bucket::Day)).await;
    assert_eq!(
        summary(&after),
        summary(&before),
        "folding keeps every total"
    );
    assert_eq!(total(&after), total(&before));
    assert_eq!(
        total(&stats(store, &all_time(), StatsRows::Server(Bucket::Day)).await),
        server_before,
        "the server's rows fold too"
    );
    let hourly = stats(store, &all_time(), StatsRows::Families(Bucket::Hour)).await;
    assert!(
        hourly.iter().all(|r| r.start % DAY == 0),
        "only day rows are left for those hours"
    );
    // Folding again (or a second process doing it) changes nothing.
    store
        .fold_stats(day_after, T0 - 500 * DAY, T0 - 500 * DAY)
        .await
        .unwrap();
    assert_eq!(
        summary(&stats(store, &all_time(), StatsRows::Families(Bucket::Day)).await),
        summary(&before)
    );

    // Days before the cut go, and with them the families no row names.
    let (_, dropped) = store
        .fold_stats(day_after, day_after, T0 + 1)
        .await
        .unwrap();
    assert!(dropped >= 4, "the day rows were dropped ({dropped})");
    assert!(stats(store, &all_time(), StatsRows::Families(Bucket::Day))
        .await
        .is_empty());
    let (kept, _) = store
        .families(&RepoId::new("stats-kept"), &[], &["a-".into()], T0)
        .await
        .unwrap();
    assert!(
        kept.is_empty(),
        "families no row names, kept before the cut, are forgotten"
    );
}
