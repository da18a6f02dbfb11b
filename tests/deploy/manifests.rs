//! Kubernetes: tests on the files (always run).

use super::*;

#[test]
fn every_yaml_file_in_deploy_parses() {
    let files = yaml_files(&repo().join("deploy"));
    assert!(files.len() >= 10, "found only {files:?}");
    for file in files {
        let docs = yaml_file(&file);
        assert!(!docs.is_empty(), "{}: no document", file.display());
    }
}

#[test]
fn the_base_assembled_from_its_files_matches_the_binary() {
    let docs = base_from_files();
    check_workload(&Workload::new("base (files)", &docs));
}

#[test]
fn every_overlay_assembled_from_its_files_matches_the_binary() {
    let names = overlay_names();
    assert_eq!(names, ["memory", "redis", "redis-cluster"]);
    for overlay in names {
        let docs = overlay_from_files(&overlay);
        let w = Workload::new(&format!("{overlay} (files)"), &docs);
        check_workload(&w);
        check_replicas_fit_the_store(&w);
    }
}

#[test]
fn the_rules_configmap_is_the_example_rules() {
    let shipped = read(&deploy("kubernetes/base/rules/example.yaml"));
    let example = read(&repo().join("examples/rules.yaml"));
    assert!(
        shipped == example,
        "deploy/kubernetes/base/rules/example.yaml differs from examples/rules.yaml: copy it again"
    );
    // Every file of base/rules/ is in the ConfigMap, and nothing else.
    let kustomization = &yaml_file(&deploy("kubernetes/base/kustomization.yaml"))[0];
    let listed: BTreeSet<String> = list(&kustomization["configMapGenerator"][0]["files"])
        .iter()
        .map(|f| s(f, "file").to_owned())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(deploy("kubernetes/base/rules"))
        .unwrap()
        .map(|e| format!("rules/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert_eq!(
        listed, present,
        "base/rules/ and the configMapGenerator differ"
    );
}

#[test]
fn the_image_tag_is_the_crate_version() {
    let kustomization = &yaml_file(&deploy("kubernetes/base/kustomization.yaml"))[0];
    let image = list(&kustomization["images"])
        .iter()
        .find(|i| i["name"] == "sluice")
        .expect("an images entry for sluice");
    assert_eq!(image["newTag"], env!("CARGO_PKG_VERSION"));
    let build = format!("-t sluice:{} .", env!("CARGO_PKG_VERSION"));
    assert!(
        read(&deploy("Dockerfile")).contains(&build),
        "the Dockerfile's build command does not tag sluice:{}",
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn no_manifest_mounts_a_volume_with_subpath() {
    for file in yaml_files(&deploy("kubernetes")) {
        for doc in yaml_file(&file) {
            let pod = &doc["spec"]["template"]["spec"];
            for container in list(&pod["containers"]) {
                for mount in list(&container["volumeMounts"]) {
                    assert!(
                        mount.get("subPath").is_none(),
                        "{}: {mount}: the kubelet never updates a subPath mount, so rules would not reload",
                        file.display()
                    );
                }
            }
        }
    }
}
