// egress-placer devcluster patch of github.com/konflux-ci/tekton-kueue v0.3.0 pkg/common/common_utils.go:
// out of cluster there is no ServiceAccount namespace file, so POD_NAMESPACE (when set) names the namespace
// the webhook and controller read their ConfigMap from; the file is read as before otherwise.
package common

import (
	"errors"
	"os"
)

const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func GetCurrentNamespace() (string, error) {
	if namespace := os.Getenv("POD_NAMESPACE"); namespace != "" {
		return namespace, nil
	}
	bytes, err := os.ReadFile(namespaceFile)
	if err != nil {
		return "", errors.New("not able to read  namespace file: " + namespaceFile)
	}
	namespace := string(bytes)
	return namespace, nil
}
