package app

import (
	"crypto/rand"
	"encoding/hex"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
