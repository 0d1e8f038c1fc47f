package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CA is a certificate authority made for one test. It signs the way
// cert-manager's CA Issuer does for the chart's Certificates: ECDSA P-256
// keys, the names and usages of the Certificate's spec, and a Secret that
// holds tls.crt, tls.key and ca.crt.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, the ca.crt of the Secrets it signs.
	PEM []byte
}

// NewCA returns a fresh self-signed CA valid for a day.
func NewCA(t testing.TB, commonName string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(t), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse CA certificate: %v", err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// LeafSpec is the part of a cert-manager Certificate's spec a leaf
// certificate is issued from.
type LeafSpec struct {
	CommonName  string
	DNSNames    []string
	IPAddresses []net.IP
	// Usages as cert-manager spells them: "server auth", "client auth",
	// "digital signature" (the last is always set).
	Usages []string
}

// Issue signs a leaf certificate valid for a day and returns it and its
// key as PEM (tls.crt and tls.key).
func (ca *CA) Issue(t testing.TB, spec LeafSpec) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(t), Subject: pkix.Name{CommonName: spec.CommonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, DNSNames: spec.DNSNames, IPAddresses: spec.IPAddresses,
	}
	for _, u := range spec.Usages {
		switch u {
		case "server auth":
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		case "client auth":
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		case "digital signature":
		default:
			t.Fatalf("certificate usage %q is not one the harness issues", u)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("sign certificate: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("encode key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// SecretData is what cert-manager writes into a Certificate's Secret.
func (ca *CA) SecretData(t testing.TB, spec LeafSpec) map[string][]byte {
	t.Helper()
	crt, key := ca.Issue(t, spec)
	return map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca.PEM}
}

func serialNumber(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("serial number: %v", err)
	}
	return n
}

// WriteSecretVolume lays files out in dir as kubelet mounts a Secret, and
// updates them the way kubelet does when the Secret changes: each key is a
// symlink through ..data into a timestamped directory, and an update
// writes a new directory and swaps ..data in one rename, so a reader never
// sees a new certificate with an old key.
func WriteSecretVolume(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("secret volume: %v", err)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	ts, err := os.MkdirTemp(dir, ".."+time.Now().Format("2006_01_02_15_04_05."))
	if err != nil {
		t.Fatalf("secret volume: %v", err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o600); err != nil {
			t.Fatalf("secret volume: %v", err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatalf("secret volume: %v", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatalf("secret volume: %v", err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatalf("secret volume: %v", err)
		}
	}
	if old != "" && strings.HasPrefix(old, "..") {
		_ = os.RemoveAll(filepath.Join(dir, old))
	}
}
