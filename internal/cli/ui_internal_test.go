package cli

import "testing"

// The token comes from the flag, else from the command's variable.
func TestUITokenPrecedence(t *testing.T) {
	a := &app{lookupEnv: func(k string) (string, bool) {
		if k == EnvUIToken {
			return "from-env", true
		}
		return "", false
	}}
	if got := a.tokenFrom("from-flag", EnvUIToken); got != "from-flag" {
		t.Errorf("flag and variable: %q, want the flag's", got)
	}
	if got := a.tokenFrom("", EnvUIToken); got != "from-env" {
		t.Errorf("variable only: %q, want the variable's", got)
	}
	if got := a.tokenFrom("", EnvMetricsToken); got != "" {
		t.Errorf("neither: %q, want none", got)
	}
}
