//! Which member credentials the hub accepts (pure): only inline ones. A kubeconfig in a
//! member Secret is data anyone who can write Secrets in `bulkhead-system` controls, so
//! nothing in it may make the hub run a program (exec plugins, auth providers) or read a
//! local file (token, certificate and key files: the hub's own service-account token is
//! such a file), and TLS verification is never skipped without the MemberCluster saying
//! so (`spec.insecureSkipTLSVerify`).

use kube::config::Kubeconfig;

/// Checks every user and cluster entry of `kubeconfig`. The error names the entry, the
/// field and the fix.
pub fn check_inline(kubeconfig: &Kubeconfig, allow_insecure: bool) -> Result<(), String> {
    let fix = "only inline credentials are accepted: token, client-certificate-data with client-key-data, certificate-authority-data";
    for named in &kubeconfig.auth_infos {
        let Some(user) = named.auth_info.as_ref() else {
            continue;
        };
        let refused = [
            (
                user.exec.is_some(),
                "exec",
                "an exec plugin would run a program inside the hub",
            ),
            (
                user.auth_provider.is_some(),
                "auth-provider",
                "an auth provider would run a plugin inside the hub",
            ),
            (
                user.token_file.is_some(),
                "tokenFile",
                "the hub would read a file of its own and send it to the member's address",
            ),
            (
                user.client_certificate.is_some(),
                "client-certificate",
                "the hub would read a local file",
            ),
            (
                user.client_key.is_some(),
                "client-key",
                "the hub would read a local file",
            ),
        ];
        if let Some((_, field, why)) = refused.into_iter().find(|(present, _, _)| *present) {
            return Err(format!(
                "users[{}].user.{field} is not allowed ({why}); {fix}",
                named.name
            ));
        }
    }
    for named in &kubeconfig.clusters {
        let Some(cluster) = named.cluster.as_ref() else {
            continue;
        };
        if cluster.certificate_authority.is_some() {
            return Err(format!(
                "clusters[{}].cluster.certificate-authority is not allowed (the hub would read a local file); {fix}",
                named.name
            ));
        }
        if cluster.server.as_deref().is_some_and(is_plain_http) && !allow_insecure {
            return Err(format!(
                "clusters[{}].cluster.server is plain http://: the hub's token would travel unencrypted; use the member's https:// address with certificate-authority-data, or set spec.insecureSkipTLSVerify: true on the MemberCluster (bulkhead join --insecure-skip-tls-verify) to accept that",
                named.name
            ));
        }
        if cluster.insecure_skip_tls_verify == Some(true) && !allow_insecure {
            return Err(format!(
                "clusters[{}].cluster.insecure-skip-tls-verify is true: the hub would send its token to an unverified server; put the member's CA in certificate-authority-data, or set spec.insecureSkipTLSVerify: true on the MemberCluster (bulkhead join --insecure-skip-tls-verify) to accept that",
                named.name
            ));
        }
    }
    Ok(())
}

/// Whether a server address is plain HTTP (no TLS at all).
pub fn is_plain_http(server: &str) -> bool {
    server
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str, cluster: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{{name: c, context: {{cluster: m, user: u}}}}]\nclusters: [{{name: m, cluster: {{server: 'https://127.0.0.1:6443', {cluster}}}}}]\nusers: [{{name: u, user: {{{user}}}}}]\n"
        ))
        .unwrap()
    }

    #[test]
    fn inline_credentials_pass() {
        let inline = kubeconfig("token: abc", "certificate-authority-data: Q0EK");
        assert_eq!(check_inline(&inline, false), Ok(()));
        let certificate = kubeconfig(
            "client-certificate-data: Q0VSVAo=, client-key-data: S0VZCg==",
            "certificate-authority-data: Q0EK",
        );
        assert_eq!(check_inline(&certificate, false), Ok(()));
    }

    #[test]
    fn programs_and_files_are_refused_with_the_field() {
        for (user, field) in [
            (
                "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, id]}",
                "exec",
            ),
            ("auth-provider: {name: gcp}", "auth-provider"),
            (
                "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "tokenFile",
            ),
            (
                "client-certificate: /etc/cert.pem, client-key-data: S0VZCg==",
                "client-certificate",
            ),
            (
                "client-certificate-data: Q0VSVAo=, client-key: /etc/key.pem",
                "client-key",
            ),
        ] {
            let error = check_inline(&kubeconfig(user, "certificate-authority-data: Q0EK"), false)
                .unwrap_err();
            assert!(
                error.contains(&format!("users[u].user.{field} is not allowed")),
                "{error}"
            );
            assert!(error.contains("only inline credentials"), "{error}");
        }
        let error = check_inline(
            &kubeconfig("token: abc", "certificate-authority: /etc/ca.pem"),
            false,
        )
        .unwrap_err();
        assert!(
            error.contains("clusters[m].cluster.certificate-authority"),
            "{error}"
        );
    }

    #[test]
    fn skipping_tls_verification_needs_the_member_clusters_consent() {
        let insecure = kubeconfig("token: abc", "insecure-skip-tls-verify: true");
        let error = check_inline(&insecure, false).unwrap_err();
        assert!(error.contains("insecure-skip-tls-verify"), "{error}");
        assert!(error.contains("spec.insecureSkipTLSVerify"), "{error}");
        assert_eq!(check_inline(&insecure, true), Ok(()));
        // Plain HTTP is no TLS at all: the same consent.
        let plain = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: m, user: u}}]\nclusters: [{name: m, cluster: {server: 'HTTP://10.0.0.1:8080'}}]\nusers: [{name: u, user: {token: abc}}]\n",
        )
        .unwrap();
        let error = check_inline(&plain, false).unwrap_err();
        assert!(
            error.contains("clusters[m].cluster.server is plain http://"),
            "{error}"
        );
        assert_eq!(check_inline(&plain, true), Ok(()));
    }
}
