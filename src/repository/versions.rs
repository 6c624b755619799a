use crate::proto::inference::{model_version_policy::PolicyChoice, ModelVersionPolicy};

/// The versions a policy serves out of those on disk (ascending input).
/// No policy means Triton's default: the latest one.
pub fn select_versions(policy: Option<&ModelVersionPolicy>, on_disk: &[i64]) -> Vec<i64> {
    let latest = |n: usize| on_disk.iter().rev().take(n.max(1)).rev().copied().collect();
    match policy.and_then(|p| p.policy_choice.as_ref()) {
        None => latest(1),
        Some(PolicyChoice::Latest(l)) => latest(l.num_versions as usize),
        Some(PolicyChoice::All(_)) => on_disk.to_vec(),
        Some(PolicyChoice::Specific(s)) => on_disk
            .iter()
            .copied()
            .filter(|v| s.versions.contains(v))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::model_version_policy::{All, Latest, Specific};

    fn policy(c: PolicyChoice) -> ModelVersionPolicy {
        ModelVersionPolicy {
            policy_choice: Some(c),
        }
    }

    #[test]
    fn default_policy_serves_the_latest_version() {
        assert_eq!(select_versions(None, &[1, 2, 10]), vec![10]);
        assert_eq!(select_versions(None, &[]), Vec::<i64>::new());
    }

    #[test]
    fn latest_all_and_specific() {
        let disk = [1, 2, 3];
        assert_eq!(
            select_versions(
                Some(&policy(PolicyChoice::Latest(Latest { num_versions: 2 }))),
                &disk
            ),
            vec![2, 3]
        );
        assert_eq!(
            select_versions(Some(&policy(PolicyChoice::All(All {}))), &disk),
            vec![1, 2, 3]
        );
        assert_eq!(
            select_versions(
                Some(&policy(PolicyChoice::Specific(Specific {
                    versions: vec![1, 3, 7]
                }))),
                &disk
            ),
            vec![1, 3]
        );
    }
}
