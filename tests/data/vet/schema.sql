CREATE TABLE sys_dt (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  cur_dt TEXT NOT NULL
);

CREATE TABLE ownr (
  own_id TEXT PRIMARY KEY NOT NULL,
  fnm TEXT NOT NULL,
  lnm TEXT NOT NULL,
  ph TEXT,
  eml TEXT,
  is_actv BOOLEAN NOT NULL DEFAULT 1
);

CREATE TABLE pet (
  pet_id TEXT PRIMARY KEY NOT NULL,
  own_id TEXT NOT NULL REFERENCES ownr(own_id),
  nm TEXT NOT NULL,
  spc TEXT NOT NULL CHECK (spc IN ('dog', 'cat', 'rbt', 'brd', 'rpt')),
  brd TEXT,
  sx TEXT CHECK (sx IN ('M', 'F')),
  dob TEXT NOT NULL,
  wt_kg REAL,
  is_neut BOOLEAN NOT NULL DEFAULT 0,
  is_dcsd BOOLEAN NOT NULL DEFAULT 0
);

CREATE TABLE vet (
  vet_id TEXT PRIMARY KEY NOT NULL,
  nm TEXT NOT NULL,
  exo_ok BOOLEAN NOT NULL DEFAULT 0,
  is_surg BOOLEAN NOT NULL DEFAULT 0,
  max_dy INTEGER NOT NULL
);

CREATE TABLE appt (
  appt_id INTEGER PRIMARY KEY,
  pet_id TEXT NOT NULL REFERENCES pet(pet_id),
  vet_id TEXT NOT NULL REFERENCES vet(vet_id),
  appt_dt TEXT NOT NULL,
  slot TEXT NOT NULL CHECK (slot IN ('08:30', '09:30', '10:30', '11:30', '14:00', '15:00', '16:00', '17:00')),
  typ TEXT NOT NULL CHECK (typ IN ('wel', 'sick', 'surg', 'vax', 'fu')),
  is_emrg BOOLEAN NOT NULL DEFAULT 0,
  sts TEXT NOT NULL DEFAULT 'bkd' CHECK (sts IN ('bkd', 'done', 'cxl', 'nos')),
  notes TEXT
);

CREATE TABLE vax (
  pet_id TEXT NOT NULL REFERENCES pet(pet_id),
  vax_cd TEXT NOT NULL CHECK (vax_cd IN ('RAB', 'DHPP', 'FVRCP', 'LEPT', 'RHD')),
  adm_dt TEXT NOT NULL,
  lot_no TEXT,
  nxt_due TEXT,
  PRIMARY KEY (pet_id, vax_cd, adm_dt)
);

CREATE TABLE inv (
  inv_no TEXT PRIMARY KEY NOT NULL,
  own_id TEXT NOT NULL REFERENCES ownr(own_id),
  appt_id INTEGER REFERENCES appt(appt_id),
  amt REAL NOT NULL CHECK (amt > 0),
  iss_dt TEXT NOT NULL,
  sts TEXT NOT NULL DEFAULT 'opn' CHECK (sts IN ('opn', 'pd', 'void'))
);

CREATE TABLE pmt (
  pmt_id INTEGER PRIMARY KEY,
  inv_no TEXT NOT NULL REFERENCES inv(inv_no),
  amt REAL NOT NULL CHECK (amt > 0),
  mthd TEXT NOT NULL CHECK (mthd IN ('card', 'cash', 'ins')),
  pd_dt TEXT
);

CREATE TRIGGER pet_bu
BEFORE UPDATE ON pet
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pet_rec: owner, species, sex and dob are fixed; deceased is final; weight positive')
  WHERE NEW.own_id IS NOT OLD.own_id OR NEW.spc IS NOT OLD.spc OR NEW.sx IS NOT OLD.sx OR NEW.dob IS NOT OLD.dob
     OR (OLD.is_dcsd = 1 AND NEW.is_dcsd = 0)
     OR NEW.wt_kg <= 0;
END;

CREATE TRIGGER appt_bi_1
BEFORE INSERT ON appt
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appt_sts: new appts are booked (bkd)')
  WHERE NEW.sts IS NOT 'bkd';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pet_elig: no appts for deceased pets or inactive owner accounts')
  WHERE NOT EXISTS (SELECT 1 FROM pet p JOIN ownr o ON o.own_id = p.own_id
                    WHERE p.pet_id = NEW.pet_id AND p.is_dcsd = 0 AND o.is_actv = 1);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: vet_qual: surgery needs a surgical vet; rabbits, birds and reptiles need an exotics vet')
  WHERE (SELECT CASE
                  WHEN NEW.typ = 'surg' AND v.is_surg = 0 THEN 1
                  WHEN p.spc IN ('rbt', 'brd', 'rpt') AND v.exo_ok = 0 THEN 1
                  ELSE 0
                END
         FROM vet v, pet p WHERE v.vet_id = NEW.vet_id AND p.pet_id = NEW.pet_id) = 1;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appt_dt_rng: appts are booked from today up to 60 days out')
  WHERE julianday(NEW.appt_dt) IS NULL
     OR julianday(NEW.appt_dt) - julianday((SELECT cur_dt FROM sys_dt)) NOT BETWEEN 0 AND 60;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: slot_clash: the vet already has a booked appt in this slot')
  WHERE EXISTS (SELECT 1 FROM appt WHERE vet_id = NEW.vet_id AND appt_dt = NEW.appt_dt
                AND slot = NEW.slot AND sts = 'bkd');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: vet_dy_cap: the vet is fully booked that day (non-emergency)')
  WHERE NEW.is_emrg = 0
    AND (SELECT COUNT(*) FROM appt WHERE vet_id = NEW.vet_id AND appt_dt = NEW.appt_dt
         AND sts = 'bkd' AND is_emrg = 0) >= (SELECT max_dy FROM vet WHERE vet_id = NEW.vet_id);
END;

CREATE TRIGGER appt_bi_2
BEFORE INSERT ON appt
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: acct_hold: owner has more than 250.00 outstanding; emergencies only')
  WHERE NEW.is_emrg = 0
    AND (SELECT COALESCE(SUM(i.amt - COALESCE((SELECT SUM(x.amt) FROM pmt x WHERE x.inv_no = i.inv_no), 0)), 0)
         FROM inv i WHERE i.sts = 'opn'
           AND i.own_id = (SELECT own_id FROM pet WHERE pet_id = NEW.pet_id)) > 250;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: surg_min_age: surgery needs a pet of at least 16 weeks with a weight on file')
  WHERE NEW.typ = 'surg'
    AND EXISTS (SELECT 1 FROM pet WHERE pet_id = NEW.pet_id
                AND (wt_kg IS NULL OR julianday(NEW.appt_dt) - julianday(dob) < 112));
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: wel_1_per_mo: max 1 wellness appt per pet per calendar month')
  WHERE NEW.typ = 'wel'
    AND EXISTS (SELECT 1 FROM appt WHERE pet_id = NEW.pet_id AND typ = 'wel' AND sts <> 'cxl'
                AND strftime('%Y-%m', appt_dt) = strftime('%Y-%m', NEW.appt_dt));
END;

CREATE TRIGGER appt_bu_fix
BEFORE UPDATE OF pet_id, vet_id, appt_dt, slot, typ, is_emrg ON appt
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appt_sts: pet, vet, date, slot and type of an appt are fixed')
  WHERE NEW.pet_id IS NOT OLD.pet_id OR NEW.vet_id IS NOT OLD.vet_id OR NEW.appt_dt IS NOT OLD.appt_dt
     OR NEW.slot IS NOT OLD.slot OR NEW.typ IS NOT OLD.typ OR NEW.is_emrg IS NOT OLD.is_emrg;
END;

CREATE TRIGGER appt_bu_sts
BEFORE UPDATE OF sts ON appt
WHEN NEW.sts IS NOT OLD.sts
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appt_sts: booked -> done/cxl/nos only; done and nos on or after the appt date')
  WHERE OLD.sts <> 'bkd'
     OR (NEW.sts IN ('done', 'nos') AND OLD.appt_dt > (SELECT cur_dt FROM sys_dt));
END;

CREATE TRIGGER appt_au_sts
AFTER UPDATE OF sts ON appt
WHEN NEW.sts = 'nos' AND OLD.sts = 'bkd'
BEGIN
  -- a no-show fee invoice of 35.00 is raised for the owner
  INSERT INTO inv (inv_no, own_id, appt_id, amt, iss_dt, sts)
  VALUES ('INV-NS-' || NEW.appt_id, (SELECT own_id FROM pet WHERE pet_id = NEW.pet_id), NEW.appt_id,
          35.0, (SELECT cur_dt FROM sys_dt), 'opn');
END;

CREATE TRIGGER vax_bi
BEFORE INSERT ON vax
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: vax_age: no future dates; min age 12 weeks for rabies, 8 weeks otherwise')
  WHERE NEW.adm_dt > (SELECT cur_dt FROM sys_dt)
     OR julianday(NEW.adm_dt) - (SELECT julianday(dob) FROM pet WHERE pet_id = NEW.pet_id)
        < CASE NEW.vax_cd WHEN 'RAB' THEN 84 ELSE 56 END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rab_intvl: rabies boosters at least 330 days apart')
  WHERE NEW.vax_cd = 'RAB'
    AND EXISTS (SELECT 1 FROM vax WHERE pet_id = NEW.pet_id AND vax_cd = 'RAB'
                AND abs(julianday(NEW.adm_dt) - julianday(adm_dt)) < 330);
END;

CREATE TRIGGER vax_ai
AFTER INSERT ON vax
BEGIN
  -- next due: 28 days while the pet is under 16 weeks, else 3 years for DHPP and 1 year for the others
  UPDATE vax
  SET nxt_due = date(NEW.adm_dt,
                     CASE
                       WHEN julianday(NEW.adm_dt) - (SELECT julianday(dob) FROM pet WHERE pet_id = NEW.pet_id) < 112
                         THEN '+28 days'
                       WHEN NEW.vax_cd = 'DHPP' THEN '+3 years'
                       ELSE '+1 year'
                     END)
  WHERE pet_id = NEW.pet_id AND vax_cd = NEW.vax_cd AND adm_dt = NEW.adm_dt;
END;

CREATE TRIGGER pmt_bi
BEFORE INSERT ON pmt
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pmt_cap: payments only on open invoices, up to the outstanding amount')
  WHERE (SELECT sts FROM inv WHERE inv_no = NEW.inv_no) IS NOT 'opn'
     OR round((SELECT COALESCE(SUM(amt), 0) FROM pmt WHERE inv_no = NEW.inv_no) + NEW.amt, 2)
        > (SELECT amt FROM inv WHERE inv_no = NEW.inv_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: ins_cap: insurance covers at most 80% of an invoice')
  WHERE NEW.mthd = 'ins'
    AND round((SELECT COALESCE(SUM(amt), 0) FROM pmt WHERE inv_no = NEW.inv_no AND mthd = 'ins') + NEW.amt, 2)
        > (SELECT round(amt * 0.8, 2) FROM inv WHERE inv_no = NEW.inv_no);
END;

CREATE TRIGGER pmt_ai
AFTER INSERT ON pmt
BEGIN
  -- payment dated today; the invoice is marked paid once fully paid
  UPDATE pmt SET pd_dt = (SELECT cur_dt FROM sys_dt) WHERE pmt_id = NEW.pmt_id;
  UPDATE inv SET sts = 'pd'
  WHERE inv_no = NEW.inv_no
    AND round((SELECT SUM(amt) FROM pmt WHERE inv_no = NEW.inv_no), 2) >= round(amt, 2);
END;

CREATE TRIGGER inv_bu
BEFORE UPDATE OF sts ON inv
WHEN NEW.sts IS NOT OLD.sts
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: inv_sts: open -> void only without payments; paid only when fully paid; paid and void are final')
  WHERE OLD.sts <> 'opn'
     OR (NEW.sts = 'void' AND EXISTS (SELECT 1 FROM pmt WHERE inv_no = NEW.inv_no))
     OR (NEW.sts = 'pd' AND round((SELECT COALESCE(SUM(amt), 0) FROM pmt WHERE inv_no = NEW.inv_no), 2)
                            < round(NEW.amt, 2));
END;
