//! The OpenAPI 3.1 description of the admin API, served at `openapi.json`.
//!
//! Written by hand (the prose and the parameters are for people), and kept honest by the
//! tests below: every schema's properties, required fields, types and formats are compared
//! with sample answers of the [`super::wire`] types, both ways, so a field added to a type
//! and not to the document (or the reverse) fails a test.

/// The document as served.
pub const DOCUMENT: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fmt::Debug;

    use serde::de::DeserializeOwned;
    use serde::Serialize;
    use serde_json::Value;

    use super::super::wire::*;
    use super::DOCUMENT;

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("openapi.json is JSON")
    }

    /// `value` as the server sends it, after checking that the CLI reads it back unchanged.
    fn sent<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: T) -> Value {
        let json = serde_json::to_value(&value).unwrap();
        let read: T = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(read, value, "reads back: {json}");
        json
    }

    fn cache() -> Cache {
        Cache {
            id: 42,
            repository_id: "1296269".into(),
            repository: "octo/hello".into(),
            git_ref: "refs/heads/main".into(),
            key: "Linux-npm-abc".into(),
            version: "v1".into(),
            size_in_bytes: 1024,
            created_at: time(1_700_000_000_000),
            last_accessed_at: time(1_700_000_100_000),
            hits: 3,
            written_by: Some(WrittenBy {
                kind: "github".into(),
                issuer: "https://token.actions.githubusercontent.com".into(),
                subject: "repo:octo/hello:ref:refs/heads/main".into(),
                run_id: "8812".into(),
                job_id: "41".into(),
                address: "192.0.2.7".into(),
            }),
            digest: Some(format!("sha256:{}", "ab".repeat(32))),
            state: "live".into(),
            // What only some entries have (a quarantine, a promotion) is shown by the samples
            // below; a field added to `Cache` shows its default here.
            ..Cache::default()
        }
    }

    /// An entry promoted from a merge queue's branch.
    fn promoted_cache() -> Cache {
        Cache {
            promoted: Some(Promoted {
                from_ref: "refs/heads/gh-readonly-queue/main/pr-104-abc".into(),
                by: "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
                cause: "merge_group:refs/heads/gh-readonly-queue/main/pr-104-abc".into(),
            }),
            ..cache()
        }
    }

    /// An entry read through from the upstream cache.
    fn read_through_cache() -> Cache {
        Cache {
            read_through: Some("results-receiver.actions.githubusercontent.com".into()),
            ..cache()
        }
    }

    fn promoted_entry(id: Option<i64>) -> PromotedEntry {
        PromotedEntry {
            id,
            from_id: 41,
            key: "Linux-npm-abc".into(),
            version: "v1".into(),
            size_in_bytes: 1024,
        }
    }

    /// An entry in quarantine.
    fn quarantined_cache() -> Cache {
        Cache {
            state: "quarantined".into(),
            quarantined_at: Some(time(1_700_000_200_000)),
            quarantine_reason: Some("quarantined by admin".into()),
            quarantine_expires_at: Some(time(1_702_592_200_000)),
            ..cache()
        }
    }

    /// An entry saved before writers were recorded.
    fn unrecorded_cache() -> Cache {
        Cache {
            written_by: None,
            digest: None,
            ..cache()
        }
    }

    fn restore() -> Restore {
        let reader = WrittenBy {
            subject: "repo:octo/hello:ref:refs/tags/v1".into(),
            run_id: "9001".into(),
            job_id: "release".into(),
            ..cache().written_by.unwrap()
        };
        Restore {
            entry_id: 42,
            repository_id: "1296269".into(),
            git_ref: "refs/heads/main".into(),
            key: "Linux-npm-abc".into(),
            written_by: cache().written_by,
            written_at: time(1_700_000_000_000),
            reader,
            first_restored_at: time(1_700_000_050_000),
            last_restored_at: time(1_700_000_100_000),
            count: 2,
        }
    }

    /// A record of an entry whose writer was not recorded.
    fn unrecorded_restore() -> Restore {
        Restore {
            written_by: None,
            ..restore()
        }
    }

    fn job() -> RestoringJob {
        RestoringJob {
            kind: "github".into(),
            subject: "repo:octo/hello:ref:refs/tags/v1".into(),
            run_id: "9001".into(),
            job_id: "release".into(),
            entries: 2,
            restores: 3,
            last_restored_at: time(1_700_000_100_000),
        }
    }

    fn totals() -> Totals {
        Totals {
            size_in_bytes: 1 << 20,
            entries: 2,
            open_uploads: 1,
        }
    }

    fn repository(hit_ratio: Option<f64>) -> Repository {
        Repository {
            repository_id: "1296269".into(),
            full_name: "octo/hello".into(),
            active_caches_size_in_bytes: 1 << 20,
            active_caches_count: 2,
            branch_caches_size_in_bytes: 1 << 19,
            branch_caches_count: 1,
            pr_and_tag_caches_size_in_bytes: 1 << 19,
            pr_and_tag_caches_count: 1,
            hits: 2,
            misses: 1,
            hit_ratio,
        }
    }

    /// With every optional field set (`full`) or none.
    fn status(full: bool) -> Status {
        let some = |n: u64| full.then_some(n);
        Status {
            version: "1.2.3".into(),
            started_at: time(1_700_000_000_000),
            uptime_seconds: 60,
            database: "sqlite".into(),
            storage: "file".into(),
            limits: Limits {
                max_entry_size: 10 << 30,
                repository_quota: some(1 << 30),
                max_storage: some(100 << 30),
                unused_ttl_seconds: some(7 * 86_400),
                max_age_seconds: some(30 * 86_400),
                max_open_uploads: 1000,
            },
            usage: totals(),
            lookups: Lookups::new(if full { 2 } else { 0 }, if full { 1 } else { 0 }),
            quarantined: 0,
            warnings: if full { vec!["Look.".into()] } else { vec![] },
            policy: Some(if full { in_force(true) } else { no_policy() }),
        }
    }

    /// A policy in force, after a failed reload (`failed`) or not.
    fn in_force(failed: bool) -> Policy {
        Policy {
            source: Some("/etc/hoard/policy.toml".into()),
            loaded_at: Some(time(1_700_000_000_000)),
            rules: vec![policy_rule(true), policy_rule(false)],
            digest: Some(format!("sha256:{}", "cd".repeat(32))),
            last_attempt: Some(PolicyAttempt {
                at: time(1_700_000_100_000),
                outcome: if failed { "failed" } else { "ok" }.into(),
                error: failed.then(|| {
                    "the policy file /etc/hoard/policy.toml, line 4: unknown variant `denied`"
                        .into()
                }),
            }),
            differs_from_file: Some(failed),
            file_changed_at: failed.then(|| time(1_700_000_090_000)),
            warnings: if failed {
                vec!["the policy file /etc/hoard/policy.toml failed to reload".into()]
            } else {
                vec![]
            },
            promotions: vec![policy_promotion()],
        }
    }

    fn policy_promotion() -> PolicyPromotion {
        PolicyPromotion {
            repository: "octo/app".into(),
            merge_queues: true,
            merged_pull_requests: true,
            forks: false,
            line: 9,
        }
    }

    fn no_policy() -> Policy {
        Policy {
            source: None,
            loaded_at: None,
            rules: vec![],
            digest: None,
            last_attempt: None,
            differs_from_file: None,
            file_changed_at: None,
            warnings: vec![],
            promotions: vec![],
        }
    }

    /// A rule limited to some callers (`callers`) or for every caller.
    fn policy_rule(callers: bool) -> PolicyRule {
        PolicyRule {
            repository: "octo/app".into(),
            scope: "refs/heads/main".into(),
            access: "read-only".into(),
            callers: callers.then(|| vec!["github".into(), "forgejo".into()]),
            line: 3,
        }
    }

    /// Each schema of the document, with the answers it describes: optional fields set and
    /// unset, lists full and empty.
    fn samples() -> Vec<(&'static str, Vec<Value>)> {
        vec![
            (
                "Error",
                vec![sent(ErrorMessage {
                    message: "no such cache entry".into(),
                })],
            ),
            (
                "Cache",
                vec![
                    sent(cache()),
                    sent(unrecorded_cache()),
                    sent(quarantined_cache()),
                    sent(promoted_cache()),
                    sent(read_through_cache()),
                ],
            ),
            ("Promoted", vec![sent(promoted_cache().promoted.unwrap())]),
            (
                "PromotedEntry",
                vec![sent(promoted_entry(Some(42))), sent(promoted_entry(None))],
            ),
            (
                "PromotionResult",
                vec![
                    sent(PromotionResult {
                        repository_id: "1296269".into(),
                        from_ref: "refs/heads/gh-readonly-queue/main/pr-104-abc".into(),
                        to_ref: "refs/heads/main".into(),
                        promoted_by: "admin:alice".into(),
                        dry_run: false,
                        promoted: vec![promoted_entry(Some(42))],
                        present: 1,
                        refused: 0,
                    }),
                    sent(PromotionResult {
                        repository_id: "1296269".into(),
                        from_ref: "refs/pull/7/merge".into(),
                        to_ref: "refs/heads/main".into(),
                        promoted_by: "admin:alice".into(),
                        dry_run: true,
                        promoted: vec![],
                        present: 0,
                        refused: 2,
                    }),
                ],
            ),
            (
                "ToolToken",
                vec![
                    sent(ToolToken {
                        token: "hoardtool.eyJy….c2ln".into(),
                        repository_id: "1296269".into(),
                        repository: "octo/hello".into(),
                        read_refs: vec!["refs/heads/main".into()],
                        write_ref: None,
                        subject: "developer:alice".into(),
                        expires_at: "2027-01-05T10:00:00.000Z".into(),
                    }),
                    sent(ToolToken {
                        token: "hoardtool.eyJy….c2ln".into(),
                        repository_id: "1296269".into(),
                        repository: String::new(),
                        read_refs: vec!["refs/heads/main".into()],
                        write_ref: Some("refs/heads/main".into()),
                        subject: "developer".into(),
                        expires_at: "2027-01-05T10:00:00.000Z".into(),
                    }),
                ],
            ),
            ("WrittenBy", vec![sent(cache().written_by.unwrap())]),
            ("PolicyPromotion", vec![sent(policy_promotion())]),
            (
                "CacheDetail",
                vec![
                    sent(CacheDetail {
                        cache: cache(),
                        restored_by: vec![restore(), unrecorded_restore()],
                    }),
                    sent(CacheDetail {
                        cache: unrecorded_cache(),
                        restored_by: vec![],
                    }),
                    sent(CacheDetail {
                        cache: read_through_cache(),
                        restored_by: vec![],
                    }),
                ],
            ),
            ("Restore", vec![sent(restore()), sent(unrecorded_restore())]),
            ("RestoringJob", vec![sent(job())]),
            (
                "RestoreList",
                vec![
                    sent(RestoreList {
                        jobs: vec![job()],
                        restores: vec![restore()],
                        truncated: true,
                    }),
                    sent(RestoreList {
                        jobs: vec![],
                        restores: vec![],
                        truncated: false,
                    }),
                ],
            ),
            (
                "CacheList",
                vec![
                    sent(CacheList {
                        total_count: 3,
                        actions_caches: vec![cache()],
                        next_cursor: Some("size_in_bytes.desc.1024.42".into()),
                    }),
                    sent(CacheList {
                        total_count: 0,
                        actions_caches: vec![],
                        next_cursor: None,
                    }),
                ],
            ),
            (
                "Deleted",
                vec![
                    sent(Deleted {
                        deleted: 2,
                        quarantine: true,
                        dry_run: true,
                        size_in_bytes: 2048,
                        ids: vec![7, 9],
                        ids_truncated: true,
                        uploads_aborted: 1,
                        restored_by: vec![job()],
                        restore_records_deleted: None,
                    }),
                    sent(Deleted {
                        deleted: 0,
                        quarantine: false,
                        dry_run: false,
                        size_in_bytes: 0,
                        ids: vec![],
                        ids_truncated: false,
                        uploads_aborted: 0,
                        restored_by: vec![],
                        restore_records_deleted: Some(0),
                    }),
                ],
            ),
            (
                "Repository",
                vec![sent(repository(Some(0.667))), sent(repository(None))],
            ),
            ("Totals", vec![sent(totals())]),
            (
                "Usage",
                vec![sent(Usage {
                    total: totals(),
                    repository_count: 1,
                    repositories: vec![repository(Some(1.0))],
                })],
            ),
            ("Status", vec![sent(status(true)), sent(status(false))]),
            (
                "Policy",
                vec![
                    sent(in_force(false)),
                    sent(in_force(true)),
                    sent(no_policy()),
                ],
            ),
            (
                "PolicyAttempt",
                vec![
                    sent(in_force(false).last_attempt.unwrap()),
                    sent(in_force(true).last_attempt.unwrap()),
                ],
            ),
            (
                "PolicyRule",
                vec![sent(policy_rule(true)), sent(policy_rule(false))],
            ),
            ("StatsCounters", vec![sent(counters())]),
            (
                "EvictionsByCause",
                vec![sent(counters().evictions_by_cause)],
            ),
            ("StatsPoint", vec![sent(point())]),
            (
                "Stats",
                vec![
                    sent(Stats {
                        bucket: "hour".into(),
                        since: bucket_time(1_700_000_000_000),
                        until: bucket_time(1_700_086_400_000),
                        repository: Some("1296269".into()),
                        family: Some("node-cache-Linux-x64-npm-".into()),
                        scope_class: Some("pull_request".into()),
                        totals: counters(),
                        series: vec![point()],
                    }),
                    sent(Stats {
                        bucket: "day".into(),
                        since: bucket_time(1_700_000_000_000),
                        until: bucket_time(1_700_086_400_000),
                        repository: None,
                        family: None,
                        scope_class: None,
                        totals: StatsCounters::default(),
                        series: vec![],
                    }),
                ],
            ),
            ("FamilyTrend", vec![sent(trend())]),
            (
                "FamilyStats",
                vec![sent(family(Some(0.5))), sent(family(None))],
            ),
            (
                "Families",
                vec![
                    sent(Families {
                        since: bucket_time(1_700_000_000_000),
                        until: bucket_time(1_700_086_400_000),
                        bucket: "day".into(),
                        quota_bytes: Some(10 << 30),
                        stored_bytes: 4096,
                        families: vec![family(Some(0.5))],
                    }),
                    sent(Families {
                        since: bucket_time(1_700_000_000_000),
                        until: bucket_time(1_700_086_400_000),
                        bucket: "hour".into(),
                        quota_bytes: None,
                        stored_bytes: 0,
                        families: vec![],
                    }),
                ],
            ),
        ]
    }

    fn counters() -> StatsCounters {
        StatsCounters {
            lookups: 4,
            exact_hits: 1,
            restore_key_hits: 1,
            misses: 2,
            bytes_restored: 2048,
            saves: 2,
            bytes_saved: 4096,
            evictions: 1,
            evictions_by_cause: EvictionsByCause {
                evicted: 1,
                expired: 0,
                quarantined: 0,
                deleted: 0,
            },
            refused_writes: 3,
            refused_reads: 1,
            promoted_hits: 1,
        }
    }

    fn point() -> StatsPoint {
        StatsPoint {
            start: bucket_time(1_700_000_000_000),
            counters: counters(),
        }
    }

    fn trend() -> FamilyTrend {
        FamilyTrend {
            lookups: vec![0, 4],
            hits: vec![0, 2],
            misses: vec![0, 2],
        }
    }

    fn family(hit_ratio: Option<f64>) -> FamilyStats {
        FamilyStats {
            repository: "1296269".into(),
            repository_name: "octo/hello".into(),
            family: "node-cache-Linux-x64-npm-".into(),
            scope_class: "default_branch".into(),
            counters: counters(),
            hit_ratio,
            bytes_stored: 4096,
            entries: 2,
            trend: trend(),
        }
    }

    /// The schema `schema` names, following a `$ref`.
    fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
        match schema["$ref"].as_str() {
            Some(r) => {
                let name = r
                    .strip_prefix("#/components/schemas/")
                    .unwrap_or_else(|| panic!("a $ref into components/schemas: {r}"));
                let found = &doc["components"]["schemas"][name];
                assert!(found.is_object(), "{r} is defined");
                found
            }
            None => schema,
        }
    }

    fn json_type(value: &Value) -> &'static str {
        match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_f64() => "number",
            Value::Number(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    fn keys<'a>(names: impl IntoIterator<Item = &'a String>) -> BTreeSet<&'a str> {
        names.into_iter().map(String::as_str).collect()
    }

    /// Every way `value` (at `at`) differs from `schema`.
    fn mismatches(doc: &Value, schema: &Value, value: &Value, at: &str, found: &mut Vec<String>) {
        // `oneOf` (a schema or null, say): some alternative must fit.
        if let Some(alternatives) = schema["oneOf"].as_array() {
            let fits = alternatives.iter().any(|alternative| {
                let mut differences = Vec::new();
                mismatches(doc, alternative, value, at, &mut differences);
                differences.is_empty()
            });
            if !fits {
                found.push(format!("{at}: {value} fits none of the document's oneOf"));
            }
            return;
        }
        // A value of a named schema is checked as that schema (its fields as `Schema.field`).
        let at = match schema["$ref"].as_str().and_then(|r| r.rsplit('/').next()) {
            Some(name) => name,
            None => at,
        };
        let schema = resolve(doc, schema);
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => {
                found.push(format!("{at}: the document gives no type"));
                return;
            }
        };
        let actual = json_type(value);
        // An integer is also a JSON Schema number.
        let allowed = types.contains(&actual) || (actual == "integer" && types.contains(&"number"));
        if !allowed {
            found.push(format!(
                "{at}: the document says {types:?}, the type sends {actual} ({value})"
            ));
        }
        if let Some(allowed) = schema["enum"].as_array() {
            if !allowed.contains(value) {
                found.push(format!("{at}: {value} is not in the document's enum"));
            }
        }
        if schema["format"] == "date-time" {
            if let Some(text) = value.as_str() {
                if humantime::parse_rfc3339(text).is_err() {
                    found.push(format!("{at}: {text:?} is not a date-time"));
                }
            }
        }
        match value {
            Value::Object(fields) => {
                let empty = serde_json::Map::new();
                let properties = schema["properties"].as_object().unwrap_or(&empty);
                let sent = keys(fields.keys());
                let mut described = keys(properties.keys());
                for missing in sent.difference(&described) {
                    found.push(format!("{at}.{missing}: sent but not in the document"));
                }
                // Fields left out when zero, added after clients that compare whole answers.
                let omissible =
                    |name: &&str| OMITTED_WHEN_ZERO.contains(&format!("{at}.{name}").as_str());
                described.retain(|name| !omissible(name) || sent.contains(name));
                for extra in described.difference(&sent) {
                    found.push(format!("{at}.{extra}: in the document but never sent"));
                }
                // Every other field is always sent (null when unset), so every one is required.
                let required: BTreeSet<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let always: BTreeSet<&str> =
                    sent.iter().copied().filter(|n| !omissible(n)).collect();
                if required != always {
                    found.push(format!(
                        "{at}: required lists {required:?}, the type always sends {always:?}"
                    ));
                }
                for (name, field) in fields {
                    if let Some(property) = properties.get(name) {
                        mismatches(doc, property, field, &format!("{at}.{name}"), found);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    mismatches(doc, &schema["items"], item, &format!("{at}[{i}]"), found);
                }
            }
            _ => {}
        }
    }

    /// The only fields an answer leaves out (when they are zero, false or unset):
    /// `Schema.field`.
    const OMITTED_WHEN_ZERO: &[&str] = &[
        "Deleted.uploads_aborted",
        "Deleted.restored_by",
        "Deleted.quarantine",
        "Deleted.restore_records_deleted",
        "Cache.quarantined_at",
        "Cache.quarantine_reason",
        "Cache.quarantine_expires_at",
        "CacheDetail.quarantined_at",
        "CacheDetail.quarantine_reason",
        "CacheDetail.quarantine_expires_at",
        "Cache.promoted",
        "CacheDetail.promoted",
        "Cache.read_through",
        "CacheDetail.read_through",
    ];

    #[test]
    fn every_schema_matches_the_answers_of_its_type() {
        let doc = document();
        let mut found = Vec::new();
        for (name, values) in samples() {
            let schema = &doc["components"]["schemas"][name];
            assert!(schema.is_object(), "the document defines {name}");
            for value in values {
                mismatches(&doc, schema, &value, name, &mut found);
            }
        }
        // The samples of one type find the same difference.
        found.sort();
        found.dedup();
        assert!(
            found.is_empty(),
            "openapi.json and wire.rs differ:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn every_schema_of_the_document_is_checked() {
        let doc = document();
        let defined = keys(doc["components"]["schemas"].as_object().unwrap().keys());
        let checked: BTreeSet<&str> = samples().iter().map(|(name, _)| *name).collect();
        assert_eq!(
            defined, checked,
            "a schema without a type, or a type without a schema"
        );
    }

    /// Every `$ref` in `value` points at something the document defines.
    fn dangling_refs(doc: &Value, value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                if let Some(r) = fields.get("$ref").and_then(Value::as_str) {
                    let target = r
                        .strip_prefix("#/")
                        .map(|path| path.split('/').fold(doc, |node, part| &node[part]));
                    if !target.is_some_and(Value::is_object) {
                        found.push(r.to_owned());
                    }
                }
                fields.values().for_each(|v| dangling_refs(doc, v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| dangling_refs(doc, v, found)),
            _ => {}
        }
    }

    #[test]
    fn the_document_is_openapi_3_1_and_describes_every_endpoint() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
        let paths = keys(doc["paths"].as_object().unwrap().keys());
        assert_eq!(
            paths,
            BTreeSet::from([
                "/status",
                "/usage",
                "/policy",
                "/stats",
                "/stats/families",
                "/caches",
                "/caches/{id}",
                "/caches/{id}/content",
                "/caches/{id}/release",
                "/restores",
                "/promotions",
                "/tokens",
                "/openapi.json"
            ])
        );
        for (path, operations) in doc["paths"].as_object().unwrap() {
            for (method, operation) in operations.as_object().unwrap() {
                if method == "parameters" {
                    continue;
                }
                assert!(
                    operation["operationId"].is_string()
                        && operation["responses"]["200"].is_object(),
                    "{method} {path} has an operationId and a 200 answer"
                );
            }
        }
        let mut dangling = Vec::new();
        dangling_refs(&doc, &doc, &mut dangling);
        assert!(dangling.is_empty(), "undefined $refs: {dangling:?}");
    }
}
