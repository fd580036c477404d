// The standard (KEP-5304) view drafs writes, decoded by the upstream decoder of
// k8s.io/dynamic-resource-allocation, and checked against drafs's own record.
//
// Run by the Rust kube tier (tests/kube.rs) after a drafs run: it points
// DRAFS_METADATA_DIR at the --metadata-dir drafs wrote and DRAFS_TREE_JSON at
// the tree's .json. Run on its own it skips, saying so.
package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// drafs's .json record, the parts compared here.
type record struct {
	Claims []struct {
		Name              string `json:"name"`
		ResourceClaimName string `json:"resourceClaimName"`
		FromTemplate      bool   `json:"fromTemplate"`
		Devices           []struct {
			Driver     string                                 `json:"driver"`
			Pool       string                                 `json:"pool"`
			Device     string                                 `json:"device"`
			Attributes map[string]resourceapi.DeviceAttribute `json:"attributes"`
			Status     *struct {
				InterfaceName   string   `json:"interfaceName"`
				IPs             []string `json:"ips"`
				HardwareAddress string   `json:"hardwareAddress"`
			} `json:"status"`
		} `json:"devices"`
	} `json:"claims"`
}

// qualified gives an attribute key its domain: unqualified keys are the driver's.
func qualified(driver, key string) string {
	if strings.Contains(key, "/") {
		return key
	}
	return driver + "/" + key
}

func attributes(driver string, in map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		b, _ := json.Marshal(v)
		out[qualified(driver, string(k))] = string(b)
	}
	return out
}

func TestDecodeStandardView(t *testing.T) {
	dir, recordPath := os.Getenv("DRAFS_METADATA_DIR"), os.Getenv("DRAFS_TREE_JSON")
	if dir == "" || recordPath == "" {
		t.Skip("DRAFS_METADATA_DIR and DRAFS_TREE_JSON unset: this test checks files written by a drafs run (cargo nextest run --test kube)")
	}
	raw, err := os.ReadFile(recordPath)
	if err != nil {
		t.Fatal(err)
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("%s: %v", recordPath, err)
	}

	files, err := filepath.Glob(filepath.Join(dir, "*", "*", "*", "*"+metadata.MetadataFileSuffix))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no metadata files under %s", dir)
	}
	// driver/pool/device -> where it was seen, to check each device is in exactly one file.
	seen := map[string]string{}
	for _, path := range files {
		rel, _ := filepath.Rel(dir, path)
		parts := strings.Split(rel, string(filepath.Separator))
		kind, claimDir, requestDir := parts[0], parts[1], parts[2]
		driver := strings.TrimSuffix(parts[3], metadata.MetadataFileSuffix)
		content, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}

		// The whole stream, with validation, into the internal type and into each version.
		var internal metadata.DeviceMetadata
		var validation error
		var gvk schema.GroupVersionKind
		if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(content)), &internal,
			devicemetadata.DecodeMetadataWithValidationResult(&validation), devicemetadata.DecodeMetadataStoreGVKResult(&gvk)); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if validation != nil {
			t.Errorf("%s: upstream validation: %v", rel, validation)
		}
		var alpha metadatav1alpha1.DeviceMetadata
		if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(content)), &alpha); err != nil {
			t.Errorf("%s: as v1alpha1: %v", rel, err)
		}
		var beta metadatav1beta1.DeviceMetadata
		if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(content)), &beta); err != nil {
			t.Errorf("%s: as v1beta1: %v", rel, err)
		}

		// Each document on its own, so both encodings are checked, not only the first.
		dec := json.NewDecoder(bytes.NewReader(content))
		versions := []string{}
		for dec.More() {
			var doc json.RawMessage
			if err := dec.Decode(&doc); err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			var one metadata.DeviceMetadata
			var oneValidation error
			var oneGVK schema.GroupVersionKind
			if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(doc)), &one,
				devicemetadata.DecodeMetadataWithValidationResult(&oneValidation), devicemetadata.DecodeMetadataStoreGVKResult(&oneGVK)); err != nil {
				t.Fatalf("%s: document %d: %v", rel, len(versions), err)
			}
			if oneValidation != nil {
				t.Errorf("%s: %s: upstream validation: %v", rel, oneGVK.Version, oneValidation)
			}
			if !reflect.DeepEqual(one.Requests, internal.Requests) || !reflect.DeepEqual(one.PodClaimName, internal.PodClaimName) {
				t.Errorf("%s: the %s document says something else than the first one", rel, oneGVK.Version)
			}
			versions = append(versions, oneGVK.Version)
		}
		sort.Strings(versions)
		if fmt.Sprint(versions) != "[v1alpha1 v1beta1]" {
			t.Errorf("%s: versions %v, want both v1alpha1 and v1beta1", rel, versions)
		}

		// The file's place agrees with its content.
		switch kind {
		case metadata.ResourceClaimTemplatesSubDir:
			if internal.PodClaimName == nil || *internal.PodClaimName != claimDir {
				t.Errorf("%s: podClaimName %v, want %q", rel, internal.PodClaimName, claimDir)
			}
		case metadata.ResourceClaimsSubDir:
			if internal.PodClaimName != nil || internal.Name != claimDir {
				t.Errorf("%s: name %q podClaimName %v, want the claim %q and no podClaimName", rel, internal.Name, internal.PodClaimName, claimDir)
			}
		default:
			t.Errorf("%s: unexpected directory %q", rel, kind)
		}

		// Every device equals drafs's record of it.
		for _, request := range internal.Requests {
			if strings.SplitN(request.Name, "/", 2)[0] != requestDir {
				t.Errorf("%s: request %q in directory %q", rel, request.Name, requestDir)
			}
			for _, device := range request.Devices {
				if device.Driver != driver {
					t.Errorf("%s: device of driver %q in the file of %q", rel, device.Driver, driver)
				}
				key := device.Driver + "/" + device.Pool + "/" + device.Name
				if prev, dup := seen[key]; dup {
					t.Errorf("%s: device %s also in %s", rel, key, prev)
				}
				seen[key] = rel
				found := false
				for _, c := range rec.Claims {
					claimMatches := (c.FromTemplate && kind == metadata.ResourceClaimTemplatesSubDir && c.Name == claimDir) ||
						(!c.FromTemplate && kind == metadata.ResourceClaimsSubDir && c.ResourceClaimName == claimDir)
					if !claimMatches {
						continue
					}
					if internal.Name != c.ResourceClaimName {
						t.Errorf("%s: metadata.name %q, want the ResourceClaim %q", rel, internal.Name, c.ResourceClaimName)
					}
					for _, d := range c.Devices {
						if d.Driver != device.Driver || d.Pool != device.Pool || d.Device != device.Name {
							continue
						}
						found = true
						want := map[string]string{}
						for k, v := range d.Attributes {
							b, _ := json.Marshal(v)
							want[qualified(d.Driver, k)] = string(b)
						}
						if got := attributes(device.Driver, device.Attributes); !reflect.DeepEqual(got, want) {
							t.Errorf("%s: %s attributes\n got %v\nwant %v", rel, key, got, want)
						}
						var gotNet, wantNet string
						if device.NetworkData != nil {
							gotNet = fmt.Sprintf("%s %v %s", device.NetworkData.InterfaceName, device.NetworkData.IPs, device.NetworkData.HardwareAddress)
						}
						if d.Status != nil && (d.Status.InterfaceName != "" || len(d.Status.IPs) > 0 || d.Status.HardwareAddress != "") {
							wantNet = fmt.Sprintf("%s %v %s", d.Status.InterfaceName, d.Status.IPs, d.Status.HardwareAddress)
						}
						if gotNet != wantNet {
							t.Errorf("%s: %s networkData %q, want %q", rel, key, gotNet, wantNet)
						}
					}
				}
				if !found {
					t.Errorf("%s: device %s is not in drafs's record", rel, key)
				}
			}
		}
	}
	for _, c := range rec.Claims {
		for _, d := range c.Devices {
			if _, ok := seen[d.Driver+"/"+d.Pool+"/"+d.Device]; !ok {
				t.Errorf("device %s/%s/%s of claim %s is in no metadata file", d.Driver, d.Pool, d.Device, c.Name)
			}
		}
	}
	t.Logf("%d files, %d devices decoded and matched", len(files), len(seen))
}
