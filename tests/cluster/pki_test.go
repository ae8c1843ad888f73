package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pki is the cluster's certificate authority and the files made from it, all under dir: made on
// the spot for each cluster, valid for a day, never reused.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CA     string // the CA's certificate (PEM)
	// SAKey and SAPub sign and check service account tokens.
	SAKey, SAPub string
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o700))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nri-accel-cluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	p := &pki{dir: dir, caCert: cert, caKey: key, CA: filepath.Join(dir, "ca.crt")}
	writePEM(t, p.CA, "CERTIFICATE", der)

	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	p.SAKey, p.SAPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	keyDER, err := x509.MarshalECPrivateKey(sa)
	must(t, err)
	writePEM(t, p.SAKey, "EC PRIVATE KEY", keyDER)
	pubDER, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	must(t, err)
	writePEM(t, p.SAPub, "PUBLIC KEY", pubDER)
	return p
}

var serial int64 = 1

// issue makes a key and a certificate signed by the CA: a client certificate for cn in the
// groups orgs, and a server certificate as well when hosts (IPs or DNS names) are given. It
// answers the paths of the certificate and the key.
func (p *pki) issue(t *testing.T, name, cn string, orgs []string, hosts ...string) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	must(t, err)
	certPath, keyPath := filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	writePEM(t, certPath, "CERTIFICATE", der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	writePEM(t, keyPath, "EC PRIVATE KEY", keyDER)
	return certPath, keyPath
}

// kubeconfig writes a kubeconfig for server with a client certificate for cn in orgs, and
// answers its path.
func (p *pki) kubeconfig(t *testing.T, name, server, cn string, orgs ...string) string {
	t.Helper()
	cert, key := p.issue(t, name, cn, orgs)
	path := filepath.Join(p.dir, name+".kubeconfig")
	must(t, os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: local
  context: {cluster: local, user: %s}
current-context: local
`, server, p.CA, name, cert, key, name)), 0o600))
	return path
}

// tokenKubeconfig writes a kubeconfig for server that authenticates with a bearer token.
func (p *pki) tokenKubeconfig(t *testing.T, name, server, token string) string {
	t.Helper()
	ca, err := os.ReadFile(p.CA)
	must(t, err)
	path := filepath.Join(p.dir, name+".kubeconfig")
	must(t, os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: %s
  user: {token: %q}
contexts:
- name: local
  context: {cluster: local, user: %s}
current-context: local
`, server, base64.StdEncoding.EncodeToString(ca), name, token, name)), 0o600))
	return path
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	must(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
}
