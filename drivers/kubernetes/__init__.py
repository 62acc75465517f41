"""The Kubernetes runtime: a sandbox is a pod with its workspace on a claim, in one namespace
(driver.py: KubernetesDriver)."""
