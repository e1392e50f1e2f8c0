# frozen_string_literal: true

# DdprofRecorder.top's ranking (lib/ddprof_recorder/pprof_views.rb): `sort: :self | :total`
# with one tie-break rule, checked against self and total values computed here from the pprof
# as google-protobuf decodes it (spec/support).
RSpec.describe "DdprofRecorder.top" do
  # Stacks leaf first; main and work hold the same total, spin and sleep the same self.
  let(:pprof) do
    recorder = DdprofRecorder::StackRecorder.new
    [[%w[work main], 100], [%w[spin work main], 350], [%w[sleep work main], 350], [%w[main], 0]].each do |names, cpu|
      recorder.record_sample(names.map { |n| [n, "app.rb", 1] }, [cpu, 1, cpu], {})
    end
    recorder.serialize!
  end

  # `{name => [self, total]}` of cpu-time, from the decoded samples.
  def expected_values
    samples_from(decode_pprof(pprof)).each_with_object(Hash.new { |h, k| h[k] = [0, 0] }) do |s, acc|
      cpu = s[:values]["cpu-time"]
      names = s[:frames].map(&:first)
      acc[names.first][0] += cpu
      names.uniq.each { |n| acc[n][1] += cpu }
    end
  end

  def ranked(sort)
    DdprofRecorder.top(pprof, sort: sort)[:rows].map { |r| [r[:name], r[:self], r[:total]] }
  end

  it "ranks by self, then total, then name" do
    values = expected_values.reject { |_, (s, t)| s.zero? && t.zero? }
    expected = values.sort_by { |name, (s, t)| [-s, -t, name] }.map { |name, (s, t)| [name, s, t] }
    expect(ranked(:self)).to eq(expected)
    expect(ranked(:self).map(&:first)).to eq(%w[sleep spin work main])
  end

  it "ranks by total, then self, then name, with sort: :total" do
    values = expected_values.reject { |_, (s, t)| s.zero? && t.zero? }
    expected = values.sort_by { |name, (s, t)| [-t, -s, name] }.map { |name, (s, t)| [name, s, t] }
    expect(ranked(:total)).to eq(expected)
    expect(ranked(:total).map(&:first)).to eq(%w[work main sleep spin])
    expect(DdprofRecorder.top(pprof, sort: :total, limit: 1)[:rows].map { |r| r[:name] }).to eq(%w[work])
  end

  it "refuses another sort" do
    expect { DdprofRecorder.top(pprof, sort: :name) }.to raise_error(ArgumentError, "sort must be :self or :total, got :name")
    expect { DdprofRecorder.top(pprof, sort: "total") }.to raise_error(ArgumentError, /got "total"/)
  end
end
